package gpuhost

// rowWidths returns the widths of the elementwise row kernels to test:
// the paths of gemmPaths, whose devices select them (setPath).
func rowWidths() []gemmPath { return gemmPaths() }

// widthDevice returns a device of threads goroutines whose elementwise
// kernels are those of path p.
func widthDevice(threads int, p gemmPath) *cpuDevice { return cpuOnPath(threads, p) }
