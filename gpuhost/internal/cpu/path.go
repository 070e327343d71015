package cpu

import (
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Path is one implementation of the CPU GEMM, and the width of the
// elementwise kernels that go with it. A device runs the best one the CPU
// supports (Named("")); gpuhost.WithGEMMPath names another for tests and
// benchmarks.
type Path uint8

const (
	// PathGo is the portable 2×4 Go kernel: every build and CPU.
	PathGo Path = iota
	// PathAVX2 is the 6×16 AVX2/FMA kernel (amd64 builds without purego).
	PathAVX2
	// PathAVX512 is the 14×32 AVX-512F kernel (the same builds). It is
	// checked against PathGo before its first use (verifyAVX512).
	PathAVX512
)

// Asm reports whether p runs the AVX2 elementwise kernels (gelu,
// layer_norm, softmax, Adam, the residual add): on every path but the
// portable one.
func (p Path) Asm() bool { return gemmHaveAsm && p != PathGo }

// Wide reports whether it runs their AVX-512 versions first (Asm too).
func (p Path) Wide() bool { return gemmHaveAsm && p == PathAVX512 }

// String returns the path's name, which Named takes.
func (p Path) String() string {
	switch p {
	case PathAVX2:
		return "avx2"
	case PathAVX512:
		return "avx512"
	default:
		return "go"
	}
}

// Paths returns the paths this build can run on this CPU, best first.
func Paths() []Path {
	var ps []Path
	if gemmHaveAVX512 {
		ps = append(ps, PathAVX512)
	}
	if gemmHaveAsm {
		ps = append(ps, PathAVX2)
	}
	return append(ps, PathGo)
}

// bestPath is the best path this build runs on this CPU, checked once
// per process: an AVX-512 kernel that fails verifyAVX512 gives AVX2, and
// the check's error for the devices' loggers.
var bestPath = sync.OnceValues(func() (Path, error) {
	p := Paths()[0]
	if p != PathAVX512 {
		return p, nil
	}
	if err := verifyAVX512(); err != nil {
		return PathAVX2, err
	}
	return p, nil
})

// Named returns the path to run for name (as gpuhost.WithGEMMPath takes
// it): name's ("" is the best one), or the best path when the CPU or
// build lacks it, and AVX2 for an AVX-512 kernel that failed its
// first-use check, which runs once per process; the error says why it is
// not the path named.
func Named(name string) (Path, error) {
	p, err := parsePath(name)
	if p == PathAVX512 {
		if best, cerr := bestPath(); best != PathAVX512 {
			return best, errors.Join(err, cerr)
		}
	}
	return p, err
}

// parsePath parses a GEMM path's name: empty means the best path; a path
// the CPU or build lacks is an error, with the best path it has.
func parsePath(v string) (Path, error) {
	best := Paths()[0]
	if v == "" {
		return best, nil
	}
	for _, p := range Paths() {
		if strings.EqualFold(v, p.String()) {
			return p, nil
		}
	}
	return best, fmt.Errorf("GEMM path %q: not one this CPU and build run (have %v)", v, Paths())
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
	if err := checkGemm(&GEMM{Threads: 1}, PathAVX512); err != nil {
		return fmt.Errorf("the AVX-512 GEMM disagrees with a float64 reference (%w); using AVX2", err)
	}
	return nil
}

// checkGemm compares g's GEMM on path p with a float64 reference on small products
// that cover full and edge tiles, more than one k block, both transposes,
// accumulation and the bias epilogue. It runs in every server's start, so
// each shape has one reference product, which the transpose and
// accumulation cases lay out differently (a Go GEMM per case cost 4 times
// as much).
func checkGemm(g *GEMM, p Path) error {
	// m above dotMaxM, so that x·Wᵀ runs on the kernel too, and one at
	// most dotMaxM, on the dot kernel: a partial block of rows, of W's
	// rows (53) and a k that is no multiple of 16.
	for _, s := range []struct{ m, n, k int }{{dotMaxM + 13, 53, 300}, {5, 53, 300}} {
		if err := checkGemmShape(g, p, s.m, s.n, s.k); err != nil {
			return fmt.Errorf("m=%d n=%d k=%d: %w", s.m, s.n, s.k, err)
		}
	}
	return nil
}

// checkGemmShape is checkGemm for one m×n×k product C0 + A·B (+ bias),
// with A and B stored as each transpose case reads them.
func checkGemmShape(g *GEMM, p Path, m, n, k int) error {
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
			g.Run(p, nil, tr[0], tr[1], m, n, k, sa, sb, got, acc, Epilogue{Bias: bb})
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
