package gpuhost

import (
	"errors"
	"fmt"
	"strings"
	"sync"
)

// gemmPath is one implementation of the CPU GEMM. The device runs the best
// one the CPU supports; [WithGEMMPath] names another for tests and
// benchmarks.
type gemmPath uint8

const (
	// pathGo is the portable 2×4 Go kernel: every build and CPU.
	pathGo gemmPath = iota
	// pathAVX2 is the 6×16 AVX2/FMA kernel (amd64 builds without purego).
	pathAVX2
	// pathAVX512 is the 14×32 AVX-512F kernel (the same builds). It is
	// checked against pathGo before its first use (verifyAVX512).
	pathAVX512
)

// asm reports whether p's device runs the AVX2 elementwise kernels
// (gelu, layer_norm, softmax, Adam, the residual add): on every path but
// the portable one, which WithGEMMPath("go") asks for.
func (p gemmPath) asm() bool { return gemmHaveAsm && p != pathGo }

// wide reports whether it runs their AVX-512 versions first (asm too).
func (p gemmPath) wide() bool { return gemmHaveAsm && p == pathAVX512 }

// String returns the name WithGEMMPath takes.
func (p gemmPath) String() string {
	switch p {
	case pathAVX2:
		return "avx2"
	case pathAVX512:
		return "avx512"
	default:
		return "go"
	}
}

// gemmPaths returns the paths this build can run on this CPU, best first.
func gemmPaths() []gemmPath {
	var ps []gemmPath
	if gemmHaveAVX512 {
		ps = append(ps, pathAVX512)
	}
	if gemmHaveAsm {
		ps = append(ps, pathAVX2)
	}
	return append(ps, pathGo)
}

// bestPath is the best path this build runs on this CPU, checked once
// per process: an AVX-512 kernel that fails verifyAVX512 gives AVX2, and
// the check's error for the devices' loggers.
var bestPath = sync.OnceValues(func() (gemmPath, error) {
	p := gemmPaths()[0]
	if p != pathAVX512 {
		return p, nil
	}
	if err := verifyAVX512(); err != nil {
		return pathAVX2, err
	}
	return p, nil
})

// pathNamed returns the path a device of WithGEMMPath(name) runs: name's
// ("" is the best one), or the best path when the CPU or build lacks it,
// and AVX2 for an AVX-512 kernel that failed its check; the error says
// why it is not the path named.
func pathNamed(name string) (gemmPath, error) {
	p, err := parsePath(name)
	if p == pathAVX512 {
		if best, cerr := bestPath(); best != pathAVX512 {
			return best, errors.Join(err, cerr)
		}
	}
	return p, err
}

// parsePath parses a GEMM path's name: empty means the best path; a path
// the CPU or build lacks is an error, with the best path it has.
func parsePath(v string) (gemmPath, error) {
	best := gemmPaths()[0]
	if v == "" {
		return best, nil
	}
	for _, p := range gemmPaths() {
		if strings.EqualFold(v, p.String()) {
			return p, nil
		}
	}
	return best, fmt.Errorf("GEMM path %q: not one this CPU and build run (have %v)", v, gemmPaths())
}

// verifyAVX512 runs small GEMMs of each transpose on the AVX-512 path
// against a float64 reference and returns the first disagreement. The
// kernel is generated code that some sessions' machines cannot execute; a
// wrong result must cost a warning and the AVX2 path, never a wrong
// answer to a caller.
func verifyAVX512() error {
	if !gemmHaveAVX512 {
		return errors.New("no AVX-512 GEMM in this CPU and build")
	}
	if err := checkGemm(cpuOnPath(1, pathAVX512)); err != nil {
		return fmt.Errorf("the AVX-512 GEMM disagrees with a float64 reference (%w); using AVX2", err)
	}
	return nil
}

// checkGemm compares dev's GEMM with a float64 reference on small products
// that cover full and edge tiles, more than one k block, both transposes,
// accumulation and the bias epilogue. It runs in every server's start, so
// each shape has one reference product, which the transpose and
// accumulation cases lay out differently (a Go GEMM per case cost 4 times
// as much).
func checkGemm(dev *cpuDevice) error {
	// m above dotMaxM, so that x·Wᵀ runs on the kernel too, and one at
	// most dotMaxM, on the dot kernel: a partial block of rows, of W's
	// rows (53) and a k that is no multiple of 16.
	for _, s := range []struct{ m, n, k int }{{dotMaxM + 13, 53, 300}, {5, 53, 300}} {
		if err := checkGemmShape(dev, s.m, s.n, s.k); err != nil {
			return fmt.Errorf("m=%d n=%d k=%d: %w", s.m, s.n, s.k, err)
		}
	}
	return nil
}

// checkGemmShape is checkGemm for one m×n×k product C0 + A·B (+ bias),
// with A and B stored as each transpose case reads them.
func checkGemmShape(dev *cpuDevice, m, n, k int) error {
	a, b, c0, bias := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n), make([]float32, n)
	// A cheap deterministic fill in [-1, 1): no math/rand in the library.
	x := uint32(12345)
	for _, s := range [][]float32{a, b, c0, bias} {
		for i := range s {
			x = x*1664525 + 1013904223
			s[i] = float32(x>>8)/(1<<23) - 1
		}
	}
	// ab is A·B, with A m×k and B k×n row-major, in float64.
	ab := make([]float64, m*n)
	for i := range m {
		out := ab[i*n : i*n+n]
		for p := range k {
			av := float64(a[i*k+p])
			for j, bv := range b[p*n : p*n+n] {
				out[j] += av * float64(bv)
			}
		}
	}
	at, bt := transposed(a, m, k), transposed(b, k, n)
	got := make([]float32, m*n)
	for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
		sa, sb := a, b
		if tr[0] {
			sa = at
		}
		if tr[1] {
			sb = bt
		}
		for _, acc := range []bool{false, true} {
			copy(got, c0)
			var bb []float32
			if acc && tr[1] {
				bb = bias // linear's case: x·Wᵀ + bias
			}
			dev.gemmStop(nil, tr[0], tr[1], m, n, k, sa, sb, got, acc, bb)
			for i, g := range got {
				w := ab[i]
				if acc {
					w += float64(c0[i])
				}
				if bb != nil {
					w += float64(bb[i%n])
				}
				// A float32 sum of 300 products of values below 1 is a
				// few ulps of the sum off the float64 one.
				if d := float64(g) - w; !(d < 1e-3 && d > -1e-3) {
					return fmt.Errorf("ta=%t tb=%t acc=%t: c[%d] = %g, want %g", tr[0], tr[1], acc, i, g, w)
				}
			}
		}
	}
	return nil
}

// transposed returns the c×r transpose of the r×c row-major s.
func transposed(s []float32, r, c int) []float32 {
	t := make([]float32, len(s))
	for i := range r {
		for j := range c {
			t[j*r+i] = s[i*c+j]
		}
	}
	return t
}
