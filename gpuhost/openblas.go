//go:build openblas && cgo

package gpuhost

import (
	"runtime"

	"github.com/moehost/moehost/gpuhost/internal/openblas"
)

// NewOpenBLAS returns a CPU device whose GEMM is OpenBLAS's cblas_sgemm
// with threads threads (threads <= 0 means runtime.GOMAXPROCS(0)); its
// other kernels are the pure-Go ones. OpenBLAS's thread count is
// process-wide, so GEMMs of all such devices run one at a time. It exists
// only in builds with -tags openblas, which need cgo and libopenblas
// (Debian: libopenblas-dev). Its Name is "cpu-openblas".
func NewOpenBLAS(threads int) Device {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	d := NewCPU(threads).(*cpuDevice)
	d.mm.Sgemm = openblas.Sgemm
	return d
}
