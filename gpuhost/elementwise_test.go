package gpuhost

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// elementwiseSizes cover whole runs of 8 lanes, tails and the thread split.
var elementwiseSizes = []int{1, 7, 8, 9, 31, 64, 1000, 4099, 3 * grainTanh}

// TestGeluKernels checks the gelu_tanh kernels, vector and portable, on
// one and two threads, against float64 over the whole float range that
// matters, including the saturated tails, where gelu and its derivative
// must be exactly 0 (x ≪ 0) or x and 1 (x ≫ 0).
func TestGeluKernels(t *testing.T) {
	t.Parallel()
	for _, asm := range []bool{false, gemmHaveAsm} {
		for _, threads := range []int{1, 2} {
			for _, n := range elementwiseSizes {
				t.Run(fmt.Sprintf("asm=%v/threads=%d/n=%d", asm, threads, n), func(t *testing.T) {
					d := &cpuDevice{threads: threads, minWork: gemmMinWork, asm: asm}
					rng := rand.New(rand.NewPCG(uint64(n), 7))
					xs, gs := make([]float32, n), make([]float32, n)
					for i := range xs {
						xs[i] = float32(rng.Float64()*24 - 12)
						gs[i] = float32(rng.Float64()*2 - 1)
					}
					if n > 4 {
						xs[0], xs[1], xs[2], xs[3] = -30, 30, 0, -9.76
					}
					x, _ := d.FromFloat32([]int{n}, xs)
					gy, _ := d.FromFloat32([]int{n}, gs)
					y, _ := d.Zeros(x.dt, x.shape)
					gx, _ := d.Zeros(x.dt, x.shape)
					if err := d.geluForward(y, x); err != nil {
						t.Fatal(err)
					}
					if err := d.geluBackward(gx, x, gy); err != nil {
						t.Fatal(err)
					}
					for i, v := range xs {
						xv := float64(v)
						th := math.Tanh(geluC * (xv + geluA*xv*xv*xv))
						wy := 0.5 * xv * (1 + th)
						wg := float64(gs[i]) * (0.5*(1+th) + 0.5*xv*(1-th*th)*geluC*(1+3*geluA*xv*xv))
						if e := math.Abs(float64(y.f32()[i]) - wy); e > 2e-6*math.Max(1, math.Abs(wy)) {
							t.Fatalf("gelu(%g) = %g, want %g", v, y.f32()[i], wy)
						}
						if e := math.Abs(float64(gx.f32()[i]) - wg); e > 1e-5 {
							t.Fatalf("gelu'(%g)·%g = %g, want %g", v, gs[i], gx.f32()[i], wg)
						}
						if math.Abs(xv) >= 10 {
							wantY, wantG := 0.0, 0.0
							if xv > 0 {
								wantY, wantG = xv, float64(gs[i])
							}
							if float64(y.f32()[i]) != wantY || float64(gx.f32()[i]) != wantG {
								t.Fatalf("saturated gelu(%g) = %g, grad %g; want exactly %g, %g", v, y.f32()[i], gx.f32()[i], wantY, wantG)
							}
						}
					}
				})
			}
		}
	}
}

// TestAdamKernels checks that the AVX2 Adam step is the scalar one bit for
// bit (it promises the same roundings), with and without weight decay and
// gradient scaling, on sizes with tails and thread splits, over several
// steps so that m and v grow from zero.
func TestAdamKernels(t *testing.T) {
	t.Parallel()
	if !gemmHaveAsm {
		t.Skip("no AVX2: only the scalar Adam runs here")
	}
	for _, c := range []adamCoeffs{
		{lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, gradScale: 1},
		{lr: 3e-2, beta1: 0.8, beta2: 0.99, eps: 1e-6, weightDecay: 0.1, gradScale: 0.37},
	} {
		for _, n := range elementwiseSizes {
			t.Run(fmt.Sprintf("wd=%g/n=%d", c.weightDecay, n), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(n), 9))
				var state [2][4]*Tensor // [asm][p, g, m, v]
				vals := make([][]float32, 4)
				for i := range vals {
					vals[i] = make([]float32, n)
					for j := range vals[i] {
						vals[i][j] = float32(rng.NormFloat64())
					}
				}
				devs := [2]*cpuDevice{{threads: 2, asm: false}, {threads: 2, asm: true}}
				for a, d := range devs {
					for i := range 4 {
						v := vals[i]
						if i >= 2 {
							v = make([]float32, n) // m and v start at zero
						}
						state[a][i], _ = d.FromFloat32([]int{n}, v)
					}
				}
				for step := 1; step <= 3; step++ {
					cs := c
					cs.bc1 = 1 - math.Pow(c.beta1, float64(step))
					cs.bc2 = 1 - math.Pow(c.beta2, float64(step))
					for a, d := range devs {
						s := state[a]
						if err := d.adamStep(s[0], s[1], s[2], s[3], cs); err != nil {
							t.Fatal(err)
						}
					}
				}
				for i, name := range []string{"p", "g", "m", "v"} {
					want, got := state[0][i].f32(), state[1][i].f32()
					for j := range want {
						if math.Float32bits(want[j]) != math.Float32bits(got[j]) {
							t.Fatalf("%s[%d]: AVX2 %g, scalar %g", name, j, got[j], want[j])
						}
					}
				}
			})
		}
	}
}
