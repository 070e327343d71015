package gpuhost

// rowWidths returns the widths of the elementwise kernels this CPU and
// build run, named by the GEMM paths that select them, best first.
func rowWidths() []gemmPath { return gemmPaths() }

// widthDevice returns a device of threads goroutines on path p and its
// elementwise kernels.
func widthDevice(threads int, p gemmPath) *cpuDevice { return cpuOnPath(threads, p) }
