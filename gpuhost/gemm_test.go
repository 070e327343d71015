package gpuhost

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// naiveGemm is the triple loop in float64 that the blocked GEMM must match.
func naiveGemm(ta, tb bool, m, n, k int, a, b []float32) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				av := a[i*k+p]
				if ta {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if tb {
					bv = b[j*k+p]
				}
				s += float64(av) * float64(bv)
			}
			c[i*n+j] = s
		}
	}
	return c
}

func randSlice(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.Float64()*2 - 1)
	}
	return s
}

// relErr returns ‖got − want‖ / ‖want‖.
func relErr(got []float32, want []float64) float64 {
	var d, w float64
	for i, v := range want {
		e := float64(got[i]) - v
		d += e * e
		w += v * v
	}
	if w == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / w)
}

func TestGemmMatchesNaive(t *testing.T) {
	t.Parallel()
	sizes := []int{1, 3, 7, 17, 65, 129}
	depths := []int{1, 7, 65, 300}
	type shape struct{ m, n, k int }
	var shapes []shape
	for _, m := range sizes {
		for _, n := range sizes {
			shapes = append(shapes, shape{m, n, depths[(m+n)%len(depths)]})
		}
	}
	// Blocks larger than MC, NC and KC, split by M and by N.
	shapes = append(shapes, shape{gemmMC + 5, 9, 2*gemmKC + 3}, shape{3, gemmNC + 7, 5}, shape{200, 2, 33})
	tests := []struct {
		name    string
		threads int
		acc     bool
	}{
		{name: "serial", threads: 1},
		{name: "threads3", threads: 3},
		{name: "serial-accumulate", threads: 1, acc: true},
		{name: "threads2-accumulate", threads: 2, acc: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := NewCPU(tt.threads).(*cpuDevice)
			d.minWork = 1 // split even small products
			rng := rand.New(rand.NewPCG(1, uint64(tt.threads)))
			for _, s := range shapes {
				if testing.Short() && s.m*s.n*s.k > 1<<18 {
					continue
				}
				for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
					a := randSlice(rng, s.m*s.k)
					b := randSlice(rng, s.k*s.n)
					c := randSlice(rng, s.m*s.n)
					want := naiveGemm(tr[0], tr[1], s.m, s.n, s.k, a, b)
					if tt.acc {
						for i, v := range c {
							want[i] += float64(v)
						}
					}
					d.gemmF32(tr[0], tr[1], s.m, s.n, s.k, a, b, c, tt.acc)
					if e := relErr(c, want); e > 1e-5 {
						t.Errorf("m=%d n=%d k=%d ta=%t tb=%t: relative error %.3g", s.m, s.n, s.k, tr[0], tr[1], e)
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
		d := NewCPU(threads).(*cpuDevice)
		for _, s := range shapes {
			b.Run(fmt.Sprintf("%s/threads=%d", s.name, threads), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, 2))
				x := randSlice(rng, s.m*s.k)
				y := randSlice(rng, s.k*s.n)
				c := make([]float32, s.m*s.n)
				for b.Loop() {
					d.gemmF32(s.ta, s.tb, s.m, s.n, s.k, x, y, c, false)
				}
				flops := 2 * float64(s.m) * float64(s.n) * float64(s.k) * float64(b.N)
				b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
