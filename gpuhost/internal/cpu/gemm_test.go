package cpu

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/moehost/moehost/internal/testing/ref"
)

func randSlice(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.Float64()*2 - 1)
	}
	return s
}

// gemmVariant is one way the CPU GEMM can run.
type gemmVariant struct {
	name    string
	path    Path
	threads int
}

// gemmVariants lists every path this CPU and build run (Paths: the
// AVX-512 and AVX2 kernels where the CPU has them, always the portable
// one) at 1 to 3 threads.
func gemmVariants(t testing.TB) []gemmVariant {
	var vs []gemmVariant
	ps := Paths()
	t.Logf("GEMM paths on this CPU and build: %v", ps)
	for _, p := range ps {
		for threads := 1; threads <= 3; threads++ {
			vs = append(vs, gemmVariant{name: fmt.Sprintf("%v/threads=%d", p, threads), path: p, threads: threads})
		}
	}
	return vs
}

// device returns a GEMM of v's threads that splits even small products;
// run it on v.path.
func (v gemmVariant) device() *GEMM { return &GEMM{Threads: v.threads, MinWork: 1} }

func TestGemmMatchesNaive(t *testing.T) {
	t.Parallel()
	type shape struct{ m, n, k int }
	var shapes []shape
	// Odd sizes around the register tiles (6×16 and 2×4) and the blocks.
	sizes := []int{1, 5, 6, 7, 15, 16, 17, 63, 97, 145, 257}
	depths := []int{1, 3, 16, 17, 97, 257, 300}
	for i, m := range sizes {
		for j, n := range sizes {
			k := depths[(i+2*j)%len(depths)]
			if m*n*k > 1<<20 {
				k = depths[(i+j)%3]
			}
			shapes = append(shapes, shape{m, n, k})
		}
	}
	// Blocks larger than MC, NC and KC of each kernel, split by M and by
	// N, and an attention-sized product.
	for _, kn := range []*asmKernel{avx2Kernel(), avx512Kernel()} {
		shapes = append(shapes,
			shape{kn.mc + goMC + 5, 9, 2*kn.kc + 3},
			shape{3, kn.nc + 17, 5},
			shape{kn.mr + 1, kn.fuseNC + kn.nr + 3, 40},
			shape{min(kn.mc+7, kn.oneMC), 2*kn.fuseNC + 5, kn.kc + 9}, // one A block past MC
			// Prefetching the next chunk of B: within a k block, into
			// the next one, and a ragged last chunk at the end of b.
			shape{37, 3*kn.fuseNC + 21, 2*kn.kc + 3},
		)
		// Every height of edge tile (the edge kernel's every body),
		// below a full panel, with full-width and ragged tiles.
		for r := 1; r < kn.mr; r++ {
			shapes = append(shapes, shape{kn.mr + r, 2*kn.nr + 3, 37})
		}
	}
	shapes = append(shapes,
		shape{dotMaxM - 1, 21, 40}, // the dot path's largest m, and past it
		shape{dotMaxM + 1, 33, 9},
		shape{7, goNC + 5, 9},
		shape{200, 2, 33},
		shape{128, 64, 128},
	)
	// x·Wᵀ's dot kernels (3×4 rows of x and W, 8 k at a time; 4×6, 16 at
	// a time): partial blocks of rows, partial blocks of W's rows (29 is
	// 24+5, 137 is 5·24+17), and k past the kernels' multiples, with n
	// large enough that gemmTiny does not take the product.
	for m := 1; m <= 9; m++ {
		for _, k := range []int{16, 31, 40, 300} {
			n := 29
			if m*n*k <= gemmTinyWork {
				n = 137
			}
			shapes = append(shapes, shape{m, n, k})
		}
	}
	variants := gemmVariants(t)
	for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
		t.Run(fmt.Sprintf("ta=%t/tb=%t", tr[0], tr[1]), func(t *testing.T) {
			t.Parallel()
			ta, tb := tr[0], tr[1]
			rng := rand.New(rand.NewPCG(1, uint64(len(variants))))
			for _, s := range shapes {
				if testing.Short() && s.m*s.n*s.k > 1<<18 {
					continue
				}
				a := randSlice(rng, s.m*s.k)
				b := randSlice(rng, s.k*s.n)
				c0 := randSlice(rng, s.m*s.n)
				want := ref.MatMul(ta, tb, s.m, s.n, s.k, a, b)
				wantAcc := make([]float64, len(want))
				for i, v := range c0 {
					wantAcc[i] = want[i] + float64(v)
				}
				// c has a tail of sentinels that no kernel may touch.
				const guard = 32
				c := make([]float32, s.m*s.n+guard)
				for _, v := range variants {
					d := v.device()
					for _, acc := range []bool{false, true} {
						copy(c, c0)
						for i := range guard {
							c[s.m*s.n+i] = float32(i)
						}
						d.F32(v.path, ta, tb, s.m, s.n, s.k, a, b, c[:s.m*s.n], acc)
						w := want
						if acc {
							w = wantAcc
						}
						if e := ref.RelErr(c, w); e > 1e-5 {
							t.Errorf("%s: m=%d n=%d k=%d acc=%t: relative error %.3g", v.name, s.m, s.n, s.k, acc, e)
						}
						for i := range guard {
							if c[s.m*s.n+i] != float32(i) {
								t.Fatalf("%s: m=%d n=%d k=%d acc=%t: wrote past the end of c", v.name, s.m, s.n, s.k, acc)
							}
						}
					}
				}
			}
		})
	}
}

// BenchmarkGemm measures the GEMM shapes of hivemind's ffn (batch 64,
// hidden 1024, 4096) as linear runs them, and a square 1024³.
func BenchmarkGemm(b *testing.B) {
	shapes := []struct {
		name    string
		ta, tb  bool
		m, n, k int
	}{
		{name: "linear-fwd-x.Wt-64x1024x4096", tb: true, m: 64, n: 4096, k: 1024},
		{name: "linear-dx-gy.W-64x4096x1024", m: 64, n: 1024, k: 4096},
		{name: "linear-dW-gyt.x-4096x64x1024", ta: true, m: 4096, n: 1024, k: 64},
		{name: "square-1024", m: 1024, n: 1024, k: 1024},
	}
	for _, threads := range []int{1, runtime.GOMAXPROCS(0)} {
		d := &GEMM{Threads: threads}
		p := Paths()[0]
		for _, s := range shapes {
			b.Run(fmt.Sprintf("%s/threads=%d", s.name, threads), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				x := randSlice(rng, s.m*s.k)
				y := randSlice(rng, s.k*s.n)
				c := make([]float32, s.m*s.n)
				for b.Loop() {
					d.F32(p, s.ta, s.tb, s.m, s.n, s.k, x, y, c, false)
				}
				flops := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(b.N)
				b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
