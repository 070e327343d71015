package gpuhost

import (
	"os"
	"strings"
	"testing"

	"github.com/moehost/moehost/gpuhost/internal/cpu"
	"github.com/moehost/moehost/internal/benchenv"
)

// rowWidths returns the widths of the elementwise kernels this CPU and
// build run, named by the GEMM paths that select them (cpuDevice.path),
// best first.
func rowWidths() []cpu.Path { return cpu.Paths() }

// widthDevice returns a device of threads goroutines on path p and its
// elementwise kernels.
func widthDevice(threads int, p cpu.Path) *cpuDevice { return cpuOnPath(threads, p) }

// requireWidthRan fails t when MOEHOST_GEMM names a width that t's cases
// did not run, so that a run meant for the AVX-512 kernels (the
// emulator's) cannot pass on the narrower ones alone.
func requireWidthRan(t *testing.T, ran map[cpu.Path]bool) {
	t.Helper()
	v := os.Getenv(benchenv.GEMM)
	if v == "" {
		return
	}
	for _, p := range []cpu.Path{cpu.PathGo, cpu.PathAVX2, cpu.PathAVX512} {
		if strings.EqualFold(v, p.String()) && !ran[p] {
			t.Fatalf("%s=%s, but no case ran the %v kernels (this CPU and build run %v)", benchenv.GEMM, v, p, rowWidths())
		}
	}
}
