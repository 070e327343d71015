package cpu

import (
	"os"
	"strings"
	"testing"

	"github.com/moehost/moehost/internal/benchenv"
)

// testPath is the path that this test binary's one-path tests and
// benchmarks run: MOEHOST_GEMM's (make test-avx512-emu sets avx512), or
// the best one this CPU and build run.
func testPath() Path {
	p, _ := Named(os.Getenv(benchenv.GEMM))
	return p
}

// requirePathRan fails t when MOEHOST_GEMM names a path that t's cases
// did not run, so that a run meant for the AVX-512 kernels (the
// emulator's) cannot pass on the narrower ones alone.
func requirePathRan(t *testing.T, ran map[Path]bool) {
	t.Helper()
	v := os.Getenv(benchenv.GEMM)
	if v == "" {
		return
	}
	for _, p := range []Path{PathGo, PathAVX2, PathAVX512} {
		if strings.EqualFold(v, p.String()) && !ran[p] {
			t.Fatalf("%s=%s, but no case ran the %v kernels (this CPU and build run %v)", benchenv.GEMM, v, p, Paths())
		}
	}
}

// TestGemmPathFromEnv fails when MOEHOST_GEMM names a path that Named
// does not give: one this CPU or build lacks, or an AVX-512 kernel that
// failed its first-use check. A run that asks for a path (make
// test-avx512-emu asks for avx512) then cannot pass on the others alone.
func TestGemmPathFromEnv(t *testing.T) {
	v := os.Getenv(benchenv.GEMM)
	if v == "" {
		t.Skipf("%s is not set", benchenv.GEMM)
	}
	p, err := Named(v)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s=%s: kernels run %v; this CPU and build run %v", benchenv.GEMM, v, p, Paths())
}
