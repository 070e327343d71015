package gpuhost

import (
	"os"

	"github.com/moehost/moehost/gpuhost/internal/cpu"
	"github.com/moehost/moehost/internal/benchenv"
)

// init gives every device of this test binary, the external tests'
// included, the GEMM path that MOEHOST_GEMM names and the cuBLAS that
// the environment points to: the library reads no environment, but
// `MOEHOST_GEMM=go go test ./gpuhost/` runs the whole suite on one path.
func init() {
	testOptions = []DeviceOption{WithGEMMPath(os.Getenv(benchenv.GEMM)), WithCUBLAS(benchenv.CUBLASPaths()...)}
}

// GEMMPaths returns the names of the GEMM paths this CPU and build run,
// best first, for the external tests' device tables.
func GEMMPaths() []string {
	var names []string
	for _, p := range cpu.Paths() {
		names = append(names, p.String())
	}
	return names
}

// NewCPUOnPath is NewCPU(threads) on the named GEMM path (and its
// elementwise kernels), splitting even small products across threads.
func NewCPUOnPath(threads int, path string) Device {
	d := NewCPU(threads).(*cpuDevice)
	for _, p := range cpu.Paths() {
		if p.String() == path {
			d.path, d.pathOf = p, nil
		}
	}
	d.mm.MinWork = 1
	return d
}
