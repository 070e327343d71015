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
