package gpuhost

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moehost/moehost/gpuhost/internal/cpu"
	"github.com/moehost/moehost/internal/testing/ref"
)

// elementwiseSizes cover whole runs of 16 and 8 lanes, an 8-lane run after
// the 16-lane ones (24, 31, 40, 47), tails and the thread split.
var elementwiseSizes = []int{1, 7, 8, 9, 16, 24, 31, 40, 47, 64, 1000, 4099, 3 * grainTanh}

// TestGeluKernels checks the gelu_tanh kernels of every width this CPU
// runs (AVX-512, AVX2, portable) on one and two threads, against float64
// over the whole float range that matters, including the saturated tails,
// where gelu and its derivative must be exactly 0 (x ≪ 0) or x and 1
// (x ≫ 0).
func TestGeluKernels(t *testing.T) {
	t.Parallel()
	ran := map[cpu.Path]bool{}
	for _, p := range rowWidths() {
		ran[p] = true
		for _, threads := range []int{1, 2} {
			for _, n := range elementwiseSizes {
				t.Run(fmt.Sprintf("%v/threads=%d/n=%d", p, threads, n), func(t *testing.T) {
					d := widthDevice(threads, p)
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
						th := math.Tanh(cpu.GeluC * (xv + cpu.GeluA*xv*xv*xv))
						wy := 0.5 * xv * (1 + th)
						wg := float64(gs[i]) * (0.5*(1+th) + 0.5*xv*(1-th*th)*cpu.GeluC*(1+3*cpu.GeluA*xv*xv))
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
	requireWidthRan(t, ran)
}

// TestAdamKernels checks that the vector Adam steps of every width this
// CPU runs (AVX-512, AVX2) are the scalar one bit for bit (they promise
// the same roundings), with and without weight decay and gradient
// scaling, on sizes with tails and thread splits, over several steps so
// that m and v grow from zero.
func TestAdamKernels(t *testing.T) {
	t.Parallel()
	ran := map[cpu.Path]bool{cpu.PathGo: true} // the reference, in every case
	for _, p := range rowWidths() {
		if p == cpu.PathGo {
			continue
		}
		ran[p] = true
		for _, c := range []adamCoeffs{
			{lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, gradScale: 1},
			{lr: 3e-2, beta1: 0.8, beta2: 0.99, eps: 1e-6, weightDecay: 0.1, gradScale: 0.37},
		} {
			for _, n := range elementwiseSizes {
				t.Run(fmt.Sprintf("%v/wd=%g/n=%d", p, c.weightDecay, n), func(t *testing.T) {
					testAdamWidth(t, p, c, n)
				})
			}
		}
	}
	requireWidthRan(t, ran)
	if !cpu.PathAVX2.Asm() {
		t.Skip("no AVX2: only the scalar Adam runs here")
	}
}

// testAdamWidth runs three Adam steps on path p's kernels and on the
// scalar loop from the same state and compares p, g, m and v bit for bit.
func testAdamWidth(t *testing.T, p cpu.Path, c adamCoeffs, n int) {
	rng := rand.New(rand.NewPCG(uint64(n), 9))
	var state [2][4]*Tensor // [scalar, vector][p, g, m, v]
	vals := make([][]float32, 4)
	for i := range vals {
		vals[i] = make([]float32, n)
		for j := range vals[i] {
			vals[i][j] = float32(rng.NormFloat64())
		}
	}
	devs := [2]*cpuDevice{widthDevice(2, cpu.PathGo), widthDevice(2, p)}
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
				t.Fatalf("%s[%d]: %v %g, scalar %g", name, j, p, got[j], want[j])
			}
		}
	}
}

// TestLayerNormKernels checks layer_norm's row kernels at every width
// this CPU runs (portable, AVX2, AVX-512), forward (plain and with the
// residual add) and backward, against float64 on row lengths with and
// without runs of 16, a run of 8 after them and tails, with rows whose
// mean is large next to their spread (the case the float64 two-pass
// statistics are for).
func TestLayerNormKernels(t *testing.T) {
	t.Parallel()
	ran := map[cpu.Path]bool{}
	for _, p := range rowWidths() {
		for _, threads := range []int{1, 2} {
			for _, h := range []int{1, 7, 8, 9, 16, 24, 31, 40, 47, 64, 1000, 1027} {
				t.Run(fmt.Sprintf("%v/threads=%d/h=%d", p, threads, h), func(t *testing.T) {
					const rows, eps = 5, 1e-5
					d := widthDevice(threads, p)
					rng := rand.New(rand.NewPCG(uint64(h), 9))
					vals := func(n int, off float64) []float32 {
						v := make([]float32, n)
						for i := range v {
							v[i] = float32(off + rng.Float64()*2 - 1)
						}
						return v
					}
					xs, rsd, ws, bs, gs := vals(rows*h, 300), vals(h, 0), vals(h, 1), vals(h, 0), vals(rows*h, 0)
					x, _ := d.FromFloat32([]int{rows, h}, xs)
					r, _ := d.FromFloat32([]int{h}, rsd)
					w, _ := d.FromFloat32([]int{h}, ws)
					b, _ := d.FromFloat32([]int{h}, bs)
					gy, _ := d.FromFloat32([]int{rows, h}, gs)
					zeros := func(s ...int) *Tensor { z, _ := d.Zeros(x.dt, s); return z }
					y, sum, y2, mean, rstd, mean2, rstd2 := zeros(rows, h), zeros(rows, h), zeros(rows, h), zeros(rows), zeros(rows), zeros(rows), zeros(rows)
					gx, gw, gb := zeros(rows, h), zeros(h), zeros(h)
					if err := d.layerNormForward(y, mean, rstd, x, w, b, eps); err != nil {
						t.Fatal(err)
					}
					if err := d.addLayerNorm(y2, sum, mean2, rstd2, x, r, w, b, eps); err != nil {
						t.Fatal(err)
					}
					if err := d.layerNormBackward(gx, gw, gb, x, w, mean, rstd, gy); err != nil {
						t.Fatal(err)
					}
					// The float64 reference, from the float32 inputs.
					wy, wy2, wgx := make([]float64, rows*h), make([]float64, rows*h), make([]float64, rows*h)
					wgw, wgb := make([]float64, h), make([]float64, h)
					for k := range rows {
						norm := func(row []float64, out []float64) (float64, float64) {
							var m, v float64
							for _, e := range row {
								m += e
							}
							m /= float64(h)
							for _, e := range row {
								v += (e - m) * (e - m)
							}
							inv := 1 / math.Sqrt(v/float64(h)+eps)
							for i, e := range row {
								out[i] = (e-m)*inv*float64(ws[i]) + float64(bs[i])
							}
							return m, inv
						}
						row, row2 := make([]float64, h), make([]float64, h)
						for i := range h {
							row[i] = float64(xs[k*h+i])
							row2[i] = float64(xs[k*h+i] + rsd[i])
							if got := sum.f32()[k*h+i]; got != xs[k*h+i]+rsd[i] {
								t.Fatalf("sum[%d,%d] = %g, want %g", k, i, got, xs[k*h+i]+rsd[i])
							}
						}
						m, inv := norm(row, wy[k*h:])
						norm(row2, wy2[k*h:])
						if e := math.Abs(float64(mean.f32()[k])-m) / math.Abs(m); e > 1e-7 {
							t.Errorf("mean[%d] = %g, want %g", k, mean.f32()[k], m)
						}
						if e := math.Abs(float64(rstd.f32()[k])-inv) / inv; e > 1e-6 {
							t.Errorf("rstd[%d] = %g, want %g", k, rstd.f32()[k], inv)
						}
						var sg, sgx float64
						for i := range h {
							gh := float64(gs[k*h+i]) * float64(ws[i])
							sg += gh
							sgx += gh * (row[i] - m) * inv
						}
						sg, sgx = sg/float64(h), sgx/float64(h)
						for i := range h {
							xh := (row[i] - m) * inv
							gh := float64(gs[k*h+i]) * float64(ws[i])
							wgx[k*h+i] = inv * (gh - sg - xh*sgx)
							wgw[i] += float64(gs[k*h+i]) * xh
							wgb[i] += float64(gs[k*h+i])
						}
					}
					for _, c := range []struct {
						name string
						got  []float32
						want []float64
						tol  float64
					}{
						{"y", y.f32(), wy, 1e-5}, {"add y", y2.f32(), wy2, 1e-5},
						// The backward reads mean and rstd as the forward kept
						// them, in float32: at a mean of 300 that rounding
						// (about 1e-5 of x̂) shows in gx and gw.
						{"gx", gx.f32(), wgx, 1e-4}, {"gw", gw.f32(), wgw, 1e-4}, {"gb", gb.f32(), wgb, 1e-5},
					} {
						if e := ref.RelErr(c.got, c.want); e > c.tol {
							t.Errorf("%s: relative error %.3g > %g", c.name, e, c.tol)
						}
					}
					ran[p] = true
				})
			}
		}
	}
	requireWidthRan(t, ran)
}

// TestSoftmaxKernels checks softmax and log-softmax along the last axis,
// forward and backward, at every width this CPU runs (portable, AVX2,
// AVX-512), against float64 on row lengths with and without runs of 16, a
// run of 8 after them and tails, and rows that stress the exponential:
// spreads of hundreds (e^t down to underflow), masked −Inf entries, and
// rows whose max is NaN, +Inf or −Inf, where every width must give what
// the Go arithmetic gives.
func TestSoftmaxKernels(t *testing.T) {
	t.Parallel()
	ran := map[cpu.Path]bool{}
	for _, dim := range []int{1, 7, 8, 9, 16, 24, 33, 40, 47, 1000, 1029} {
		rng := rand.New(rand.NewPCG(uint64(dim), 11))
		const rows = 7
		xs := make([]float32, rows*dim)
		for i := range xs {
			switch r := i / dim; r {
			case 0:
				xs[i] = float32(rng.Float64()*6 - 3)
			case 1: // a spread of hundreds: most terms underflow
				xs[i] = float32(rng.Float64()*1400 - 700)
			case 2: // masked entries
				xs[i] = float32(rng.Float64()*4 - 2)
				if i%3 == 0 && i%dim != 0 {
					xs[i] = float32(math.Inf(-1))
				}
			default:
				xs[i] = float32(rng.Float64()*60 - 30)
			}
		}
		xs[4*dim+dim/2] = float32(math.NaN())
		xs[5*dim+dim/2] = float32(math.Inf(1))
		for i := range dim {
			xs[6*dim+i] = float32(math.Inf(-1))
		}
		gs := make([]float32, rows*dim) // the backward's, the same at every width
		for i := range gs {
			gs[i] = float32(rng.Float64()*2 - 1)
		}
		for _, log := range []bool{false, true} {
			var want [][]float32 // the portable width's rows 4–6
			// cpu.PathGo, the last width, first.
			for ws, i := rowWidths(), len(rowWidths())-1; i >= 0; i-- {
				p := ws[i]
				t.Run(fmt.Sprintf("dim=%d/log=%t/%v", dim, log, p), func(t *testing.T) {
					d := widthDevice(2, p)
					x, _ := d.FromFloat32([]int{rows, dim}, xs)
					y, _ := d.Zeros(x.dt, x.shape)
					if err := d.softmax(y, x, rows, dim, 1, log); err != nil {
						t.Fatal(err)
					}
					for r := range 4 {
						row := xs[r*dim : (r+1)*dim]
						m := math.Inf(-1)
						for _, v := range row {
							m = max(m, float64(v))
						}
						var s float64
						for _, v := range row {
							s += math.Exp(float64(v) - m)
						}
						exact := make([]float64, dim)
						for i, v := range row {
							if log {
								exact[i] = float64(v) - m - math.Log(s)
							} else {
								exact[i] = math.Exp(float64(v)-m) / s
							}
						}
						got := y.f32()[r*dim : (r+1)*dim]
						if log {
							for i, v := range exact {
								if math.IsInf(v, -1) && math.IsInf(float64(got[i]), -1) {
									exact[i], got[i] = 0, 0 // masked: both −Inf
								}
							}
						}
						if e := ref.RelErr(got, exact); e > 1e-6 {
							t.Errorf("row %d: relative error %.3g", r, e)
						}
					}
					// The backward, from the output just made.
					gy, _ := d.FromFloat32(x.shape, gs)
					gx, _ := d.Zeros(x.dt, x.shape)
					if err := d.softmaxBackward(gx, y, gy, rows, dim, 1, log); err != nil {
						t.Fatal(err)
					}
					for r := range 4 {
						yr, gr := y.f32()[r*dim:(r+1)*dim], gs[r*dim:(r+1)*dim]
						var s float64
						for i, v := range yr {
							if log {
								s += float64(gr[i])
							} else {
								s += float64(gr[i]) * float64(v)
							}
						}
						exact := make([]float64, dim)
						var sa, ny, nr float64
						for i, v := range yr {
							if log {
								exact[i] = float64(gr[i]) - math.Exp(float64(v))*s
							} else {
								exact[i] = float64(v) * (float64(gr[i]) - s)
							}
							sa += math.Abs(float64(gr[i]) * float64(v))
							ny += float64(v) * float64(v)
							nr += exact[i] * exact[i]
						}
						// softmax's gx = y·(gy − s) cancels where y is nearly
						// one-hot (row 1's spread of hundreds on short rows):
						// there the order in which a width adds s, off by up
						// to dim ulps of Σ|gy·y|, shows in gx. Elsewhere that
						// term is far below 1e-6. (log-softmax's stays in Go.)
						tol := 1e-6
						if !log && nr > 0 {
							tol += float64(dim) * 0x1p-52 * sa * math.Sqrt(ny/nr)
						}
						if e := ref.RelErr(gx.f32()[r*dim:(r+1)*dim], exact); e > tol {
							t.Errorf("backward row %d: relative error %.3g > %.3g", r, e, tol)
						}
					}
					var rs [][]float32
					for r := 4; r < rows; r++ {
						rs = append(rs, append([]float32(nil), y.f32()[r*dim:(r+1)*dim]...))
						rs = append(rs, append([]float32(nil), gx.f32()[r*dim:(r+1)*dim]...))
					}
					ran[p] = true
					if p == cpu.PathGo {
						want = rs
						return
					}
					for i := range rs {
						for j := range rs[i] {
							if g, w := rs[i][j], want[i][j]; g != w && !(g != g && w != w) {
								t.Fatalf("row %d[%d] (gradient: %t) = %g, the Go path gives %g", 4+i/2, j, i%2 == 1, g, w)
							}
						}
					}
				})
			}
		}
	}
	requireWidthRan(t, ran)
}
