package gpuhost

import (
	"os"
	"strings"
	"testing"

	"github.com/moehost/moehost/internal/benchenv"
)

// rowWidths returns the widths of the elementwise kernels this CPU and
// build run, named by the GEMM paths that select them (cpuDevice.path),
// best first.
func rowWidths() []gemmPath { return gemmPaths() }

// widthDevice returns a device of threads goroutines on path p and its
// elementwise kernels.
func widthDevice(threads int, p gemmPath) *cpuDevice { return cpuOnPath(threads, p) }

// requireWidthRan fails t when MOEHOST_GEMM names a width that t's cases
// did not run, so that a run meant for the AVX-512 kernels (the
// emulator's) cannot pass on the narrower ones alone.
func requireWidthRan(t *testing.T, ran map[gemmPath]bool) {
	t.Helper()
	v := os.Getenv(benchenv.GEMM)
	if v == "" {
		return
	}
	for _, p := range []gemmPath{pathGo, pathAVX2, pathAVX512} {
		if strings.EqualFold(v, p.String()) && !ran[p] {
			t.Fatalf("%s=%s, but no case ran the %v kernels (this CPU and build run %v)", benchenv.GEMM, v, p, rowWidths())
		}
	}
}
