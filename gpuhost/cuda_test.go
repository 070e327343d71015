//go:build cuda || cudaemu

package gpuhost

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/moehost/moehost/abi"
)

// TestCUDAKernelsMatchCPU runs the CUDA device's GEMM, elementwise and
// optimizer kernels against the CPU device's on shapes that the op table's
// small ones do not reach: more rows than a sumRows block has lanes,
// columns that are not a multiple of its 32, more elements than
// launch1D's grid covers at once (so the grid-stride loops wrap), and
// bmm's per-batch path with several batches adding into one c. Inputs
// are random and nonzero; results must agree within float32 rounding.
func TestCUDAKernelsMatchCPU(t *testing.T) {
	dev, err := NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	gd := dev.(*cudaDevice)
	cpu := NewCPU(2).(*cpuDevice)
	big := 77 * 13700 // past one grid's worth (cudaBlock·cudaMaxGrid), a multiple of 77
	if big <= cudaBlock*cudaMaxGrid {
		t.Fatal("big does not pass one grid")
	}
	rng := rand.New(rand.NewPCG(13, 13))
	pair := func(t *testing.T, shape []int, lo, hi float64) (*Tensor, *Tensor) {
		t.Helper()
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(lo + (hi-lo)*rng.Float64())
			if v[i] == 0 {
				v[i] = 0.5
			}
		}
		c, err := cpu.FromFloat32(shape, v)
		if err != nil {
			t.Fatal(err)
		}
		g, err := gd.FromFloat32(shape, v)
		if err != nil {
			t.Fatal(err)
		}
		return c, g
	}
	out := func(t *testing.T, shape ...int) (*Tensor, *Tensor) {
		t.Helper()
		c, err := cpu.allocDirty(abi.DTypeFloat32, shape)
		if err != nil {
			t.Fatal(err)
		}
		g, err := gd.allocDirty(abi.DTypeFloat32, shape)
		if err != nil {
			t.Fatal(err)
		}
		return c, g
	}
	// same checks |gpu − cpu| ≤ tol·(1 + |cpu|) for every element.
	same := func(t *testing.T, what string, c, g *Tensor, tol float64) {
		t.Helper()
		want := c.f32()
		got, err := gd.Float32s(g)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= tol*(1+math.Abs(float64(want[i])))) {
				t.Fatalf("%s: element %d of %d is %v, the CPU's %v", what, i, len(want), got[i], want[i])
			}
		}
	}

	t.Run("sumRows", func(t *testing.T) {
		for _, s := range [][2]int{{1000, 70}, {9, 33}, {3, 1}, {2000, 1}} {
			xc, xg := pair(t, []int{s[0], s[1]}, -1, 1)
			yc, yg := out(t, s[1])
			if err := cpu.sumRows(yc, xc); err != nil {
				t.Fatal(err)
			}
			if err := gd.sumRows(yg, xg); err != nil {
				t.Fatal(err)
			}
			same(t, fmt.Sprintf("sumRows %v", s), yc, yg, 1e-4)
		}
	})
	// elementwise runs the elementwise kernels over n elements; all
	// (every unary function, forward and backward) when all is set.
	elementwise := func(t *testing.T, n int, all bool) {
		xc, xg := pair(t, []int{n}, -4, 4)
		gc, gg := pair(t, []int{n}, -1, 1)
		hc, hg := pair(t, []int{n}, -1, 1)
		sc, sg := pair(t, []int{77}, -2, 2)
		yc, yg := out(t, n)
		run := func(what string, tol float64, fc, fg func() error) {
			t.Helper()
			if err := fc(); err != nil {
				t.Fatal(err)
			}
			if err := fg(); err != nil {
				t.Fatal(err)
			}
			same(t, what, yc, yg, tol)
		}
		run("gelu", 1e-5, func() error { return cpu.geluForward(yc, xc) }, func() error { return gd.geluForward(yg, xg) })
		run("gelu backward", 1e-5, func() error { return cpu.geluBackward(yc, xc, gc) }, func() error { return gd.geluBackward(yg, xg, gg) })
		run("addRepeat", 0, func() error { return cpu.addRepeat(yc, xc, sc) }, func() error { return gd.addRepeat(yg, xg, sg) })
		run("binary sub", 0, func() error { return cpu.binary(binarySub, yc, sc, xc) }, func() error { return gd.binary(binarySub, yg, sg, xg) })
		run("unary exp", 1e-6, func() error { return cpu.unary(unaryExp, 0, yc, xc) }, func() error { return gd.unary(unaryExp, 0, yg, xg) })
		if !all {
			return
		}
		for fn := binaryAdd; fn <= binaryDiv; fn++ {
			run(fmt.Sprintf("binary %d", fn), 0, func() error { return cpu.binary(fn, yc, xc, sc) }, func() error { return gd.binary(fn, yg, xg, sg) })
		}
		// log and sqrt take exp(g), which is positive.
		if err := cpu.unary(unaryExp, 0, gc, gc); err != nil {
			t.Fatal(err)
		}
		if err := gd.unary(unaryExp, 0, gg, gg); err != nil {
			t.Fatal(err)
		}
		zc, zg := out(t, n)
		for fn := unaryScale; fn <= unaryNeg; fn++ {
			x, xgg := xc, xg
			if fn == unaryLog || fn == unarySqrt {
				x, xgg = gc, gg
			}
			run(fmt.Sprintf("unary %d", fn), 1e-6, func() error { return cpu.unary(fn, 1.5, zc, x) }, func() error { return gd.unary(fn, 1.5, zg, xgg) })
			same(t, fmt.Sprintf("unary %d", fn), zc, zg, 1e-6)
			run(fmt.Sprintf("unary backward %d", fn), 1e-6, func() error { return cpu.unaryBackward(fn, 1.5, yc, x, zc, hc) }, func() error { return gd.unaryBackward(fn, 1.5, yg, xgg, zg, hg) })
		}
	}
	t.Run("elementwise", func(t *testing.T) { elementwise(t, 77*130, true) })
	t.Run("grid-stride", func(t *testing.T) { elementwise(t, big, false) })
	t.Run("sumSquares", func(t *testing.T) {
		for _, n := range []int{1, 255, 257, big} {
			xc, xg := pair(t, []int{n}, -3, 3)
			want, _ := cpu.sumSquares(xc)
			got, err := gd.sumSquares(xg)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-want) > 1e-12*want {
				t.Errorf("n %d: sum of squares %v, the CPU's %v", n, got, want)
			}
		}
	})
	t.Run("optimizers", func(t *testing.T) {
		pc, pg := pair(t, []int{big}, -1, 1)
		gc, gg := pair(t, []int{big}, -1, 1)
		mc, mg := pair(t, []int{big}, -0.1, 0.1)
		vc, vg := pair(t, []int{big}, 0, 0.01)
		for _, c := range []adamCoeffs{
			{lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weightDecay: 0.01, bc1: 0.1, bc2: 0.001, decoupled: true, gradScale: 0.7},
			{lr: 1e-2, beta1: 0.8, beta2: 0.99, eps: 1e-6, weightDecay: 0.1, bc1: 0.5, bc2: 0.3, gradScale: 1},
		} {
			if err := cpu.adamStep(pc, gc, mc, vc, c); err != nil {
				t.Fatal(err)
			}
			if err := gd.adamStep(pg, gg, mg, vg, c); err != nil {
				t.Fatal(err)
			}
			// Rounded step by step as the CPU's: the same bits.
			same(t, "adam p", pc, pg, 0)
			same(t, "adam m", mc, mg, 0)
			same(t, "adam v", vc, vg, 0)
		}
		for _, c := range []sgdCoeffs{{lr: 0.1, momentum: 0.9, weightDecay: 0.01, gradScale: 0.5}, {lr: 0.05, gradScale: 1}} {
			var bc, bg *Tensor
			if c.momentum != 0 {
				bc, bg = mc, mg
			}
			if err := cpu.sgdStep(pc, gc, bc, c); err != nil {
				t.Fatal(err)
			}
			if err := gd.sgdStep(pg, gg, bg, c); err != nil {
				t.Fatal(err)
			}
			same(t, "sgd p", pc, pg, 0)
			if bc != nil {
				same(t, "sgd buf", bc, bg, 0)
			}
		}
	})
	t.Run("bmm", func(t *testing.T) {
		const batch, m, n, k = 6, 5, 7, 33
		for _, tc := range []struct{ na, nb, nc int }{{6, 6, 6}, {1, 6, 6}, {6, 1, 6}, {6, 6, 1}, {6, 6, 3}, {3, 2, 6}} {
			for _, acc := range []bool{false, true} {
				ac, ag := pair(t, []int{tc.na, k, m}, -1, 1) // ta
				bc, bg := pair(t, []int{tc.nb, n, k}, -1, 1) // tb
				cc, cg := pair(t, []int{tc.nc, m, n}, -1, 1)
				if err := cpu.bmm(true, true, batch, m, n, k, ac, tc.na, bc, tc.nb, cc, tc.nc, acc); err != nil {
					t.Fatal(err)
				}
				if err := gd.bmm(true, true, batch, m, n, k, ag, tc.na, bg, tc.nb, cg, tc.nc, acc); err != nil {
					t.Fatal(err)
				}
				same(t, fmt.Sprintf("bmm %+v acc %v", tc, acc), cc, cg, 1e-5)
			}
		}
	})
}

// TestCUDAClose frees the pool and the context: the emulator's memory in
// use drops to zero, and the closed device refuses work with an error.
func TestCUDAClose(t *testing.T) {
	dev, err := NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	d := dev.(*cudaDevice)
	kept, err := d.Zeros(abi.DTypeFloat32, []int{1024})
	if err != nil {
		t.Fatal(err)
	}
	pooled, err := d.Zeros(abi.DTypeFloat32, []int{4096})
	if err != nil {
		t.Fatal(err)
	}
	d.Release(pooled)
	if d.MemStats().PoolBytes == 0 {
		t.Fatal("a released tensor was not pooled")
	}
	if free, total, err := d.ctx.MemInfo(); err != nil || free == total {
		t.Fatalf("before Close the context holds nothing: %d of %d bytes free, %v", free, total, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if free, total, err := d.ctx.MemInfo(); err == nil && free != total {
		t.Errorf("after Close the context holds %d of %d bytes", total-free, total)
	}
	if _, err := d.Zeros(abi.DTypeFloat32, []int{8}); err == nil {
		t.Error("a closed device allocated")
	}
	if _, err := d.Float32s(kept); err == nil {
		t.Error("a closed device read a tensor")
	}
}
