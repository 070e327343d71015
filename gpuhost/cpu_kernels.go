package gpuhost

import (
	"math"

	"github.com/moehost/moehost/gpuhost/internal/cpu"
)

// parallelFor runs fn over [0, n) in up to d.threads contiguous chunks of at
// least grain items, the last chunk on the calling goroutine. With a stop
// channel, each chunk runs in steps of stepGrains grains (a fraction of a
// millisecond of work) and looks at stop between steps, so that a kernel
// outlives its op's deadline by at most a step; it then returns
// errStopped and leaves its output half-written.
func (d *cpuDevice) parallelFor(stop <-chan struct{}, n, grain int, fn func(lo, hi int)) error {
	grain = max(grain, 1)
	run := fn
	if stop != nil {
		step := grain * stepGrains
		run = func(lo, hi int) {
			for s := lo; s < hi && !stopped(stop); s += step {
				fn(s, min(s+step, hi))
			}
		}
	}
	workers := min(d.threads, max(1, n/grain))
	if workers <= 1 {
		run(0, n)
	} else {
		var wg cpu.Join
		for w := range workers - 1 {
			lo, hi := n*w/workers, n*(w+1)/workers
			wg.Go(func() { run(lo, hi) })
		}
		run(n*(workers-1)/workers, n)
		wg.Wait()
	}
	if stopped(stop) {
		return errStopped
	}
	return nil
}

// stepGrains is how many grains a kernel runs between looks at its stop
// channel: grains are tens of microseconds, so a step is well under a
// millisecond (a few under -race), and the look, a non-blocking receive,
// costs nothing next to it.
const stepGrains = 8

// Grains: the items one goroutine should get at least, so that spawning it
// pays off (about tens of microseconds of work).
const (
	grainCheap = 1 << 15 // adds and copies
	grainTanh  = 1 << 12 // elements of gelu
)

// addRepeat implements kernels.addRepeat: small repeats along dst, and
// each chunk of dst is walked in runs within one repeat, as in binary;
// with AVX2, a run's whole 8s are one vector add, and on the AVX-512 path
// its whole 16s.
func (d *cpuDevice) addRepeat(dst, src, small *Tensor) error {
	o, x, s := dst.f32(), src.f32(), small.f32()
	ns := len(s)
	return d.parallelFor(dst.stop, len(o), grainCheap, func(lo, hi int) {
		for lo < hi {
			off := lo % ns
			end := min(hi, lo-off+ns)
			cpu.AddRow(o[lo:end], x[lo:end], s[off:off+end-lo], d.kpath())
			lo = end
		}
	})
}

// sumRows implements kernels.sumRows. Columns are split across threads and
// each thread walks the rows, so reads stay sequential within a row chunk.
func (d *cpuDevice) sumRows(dst, src *Tensor) error {
	o, x := dst.f32(), src.f32()
	n := len(o)
	rows := len(x) / n
	return d.parallelFor(dst.stop, n, max(1, grainCheap/rows), func(lo, hi int) {
		acc := make([]float32, hi-lo)
		for r := range rows {
			row := x[r*n+lo : r*n+hi]
			for j, v := range row {
				acc[j] += v
			}
		}
		copy(o[lo:hi], acc)
	})
}

// copy implements kernels.copy.
func (d *cpuDevice) copy(dst, src *Tensor) error {
	copy(dst.f32(), src.f32())
	return nil
}

// geluForward implements kernels.geluForward in float32, with
// cpu.GeluForward's tanh approximation; the vector kernels take whole
// runs of 16 (AVX-512) and 8.
func (d *cpuDevice) geluForward(y, x *Tensor) error {
	o, in := y.f32(), x.f32()
	return d.parallelFor(y.stop, len(in), grainTanh, func(lo, hi int) {
		cpu.GeluForward(o[lo:hi], in[lo:hi], d.kpath())
	})
}

// geluBackward implements kernels.geluBackward with the exact derivative of
// the tanh form: ½(1+t) + ½x(1−t²)·c(1+3a·x²), t = tanh(c(x+a·x³)).
func (d *cpuDevice) geluBackward(gx, x, gy *Tensor) error {
	o, in, g := gx.f32(), x.f32(), gy.f32()
	return d.parallelFor(gx.stop, len(in), grainTanh, func(lo, hi int) {
		cpu.GeluBackward(o[lo:hi], in[lo:hi], g[lo:hi], d.kpath())
	})
}

// layerNormForward implements kernels.layerNormForward. Row statistics are
// accumulated in float64, two-pass, so a large mean does not eat the
// variance.
func (d *cpuDevice) layerNormForward(y, mean, rstd, x, w, b *Tensor, eps float64) error {
	o, in, ww, bb := y.f32(), x.f32(), w.f32(), b.f32()
	mu, rs := mean.f32(), rstd.f32()
	h := len(ww)
	return d.parallelFor(y.stop, len(mu), max(1, grainCheap/h), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			m, inv := d.layerNormRow(o[r*h:(r+1)*h], in[r*h:(r+1)*h], ww, bb, eps)
			mu[r], rs[r] = float32(m), float32(inv)
		}
	})
}

// addLayerNorm sets y = layer_norm(x + res) over rows of length w.Len(),
// a row at a time, so that the sum never leaves the cache; res repeats
// along x (its length divides x's and is a multiple of the row). sum, when
// not nil, receives x + res for the backward; without it the sum is
// formed in y's row and normalised in place.
func (d *cpuDevice) addLayerNorm(y, sum, mean, rstd, x, res, w, b *Tensor, eps float64) error {
	o, in, rr, ww, bb := y.f32(), x.f32(), res.f32(), w.f32(), b.f32()
	mu, rs := mean.f32(), rstd.f32()
	var sm []float32
	if sum != nil {
		sm = sum.f32()
	}
	h := len(ww)
	return d.parallelFor(y.stop, len(mu), max(1, grainCheap/h), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			or := o[r*h : (r+1)*h]
			sr := or
			if sm != nil {
				sr = sm[r*h : (r+1)*h]
			}
			off := r * h % len(rr)
			xr, rsd := in[r*h:(r+1)*h], rr[off:off+h]
			m, inv := cpu.NormRow(or, sr, ww, bb, eps, cpu.AddRowSum(sr, xr, rsd, d.kpath()), d.kpath())
			mu[r], rs[r] = float32(m), float32(inv)
		}
	})
}

// layerNormRow normalises one row, y = (x − mean)·rstd·w + b, and returns
// its mean and rstd. y may be x.
func (d *cpuDevice) layerNormRow(y, x, w, b []float32, eps float64) (mean, rstd float64) {
	return cpu.NormRow(y, x, w, b, eps, cpu.RowSum(x, d.kpath()), d.kpath())
}

// layerNormBackward implements kernels.layerNormBackward:
// gx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)) with ĝ = gy·w, gw = Σ gy·x̂,
// gb = Σ gy over rows.
func (d *cpuDevice) layerNormBackward(gx, gw, gb, x, w, mean, rstd, gy *Tensor) error {
	in, ww, g := x.f32(), w.f32(), gy.f32()
	mu, rs := mean.f32(), rstd.f32()
	h := len(ww)
	rows := len(mu)
	if gx != nil {
		o := gx.f32()
		if err := d.parallelFor(gx.stop, rows, max(1, grainCheap/h), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				cpu.NormRowGrad(o[r*h:(r+1)*h], in[r*h:(r+1)*h], g[r*h:(r+1)*h], ww, float64(mu[r]), float64(rs[r]), d.kpath())
			}
		}); err != nil {
			return err
		}
	}
	if gw == nil && gb == nil {
		return nil
	}
	// Column sums; split columns across threads, as in sumRows.
	return d.parallelFor(gradStop(gw, gb), h, max(1, grainCheap/rows), func(lo, hi int) {
		sw := make([]float64, hi-lo)
		sb := make([]float64, hi-lo)
		for r := range rows {
			cpu.NormColsGrad(sw, sb, in[r*h+lo:r*h+hi], g[r*h+lo:r*h+hi], float64(mu[r]), float64(rs[r]), d.kpath())
		}
		if gw != nil {
			o := gw.f32()[lo:hi]
			for i, v := range sw {
				o[i] = float32(v)
			}
		}
		if gb != nil {
			o := gb.f32()[lo:hi]
			for i, v := range sb {
				o[i] = float32(v)
			}
		}
	})
}

// sgdStep implements kernels.sgdStep. The explicit conversions keep each
// product rounded to float32 on every architecture (no fused multiply-add),
// so the step is reproducible bit for bit.
func (d *cpuDevice) sgdStep(p, g, buf *Tensor, c sgdCoeffs) error {
	pp, gg := p.f32(), g.f32()
	var bb []float32
	if buf != nil {
		bb = buf.f32()
	}
	l := float32(c.lr)
	wd := float32(c.weightDecay)
	mom := float32(c.momentum)
	scale := float32(c.gradScale)
	return d.parallelFor(nil, len(pp), grainCheap, func(lo, hi int) {
		ps, gs := pp[lo:hi], gg[lo:hi]
		gs = gs[:len(ps)]
		for i, pv := range ps {
			gv := gs[i]
			if scale != 1 {
				gv = float32(gv * scale)
			}
			if wd != 0 {
				gv += float32(wd * pv)
			}
			if bb != nil {
				b := float32(mom*bb[lo+i]) + gv
				bb[lo+i] = b
				gv = b
			}
			ps[i] = pv - float32(l*gv)
		}
	})
}

// adamStep implements kernels.adamStep in the order of torch's
// single-tensor Adam: g += wd·p (AdamW: p *= 1 − lr·wd instead);
// m = lerp(m, g, 1−β1); v = β2·v + (1−β2)·g²;
// p −= lr/bc1 · m / (√v/√bc2 + eps). Scalars are float64 as in torch;
// element math is float32 like torch's float32 tensors.
func (d *cpuDevice) adamStep(p, g, m, v *Tensor, c adamCoeffs) error {
	pp, gg, mm, vv := p.f32(), g.f32(), m.f32(), v.f32()
	wd := float32(c.weightDecay)
	decay := 1 - c.lr*c.weightDecay // float64: see RATIONALE, AdamW's decay
	scale := float32(c.gradScale)
	w1 := float32(1 - c.beta1)
	b2 := float32(c.beta2)
	w2 := float32(1 - c.beta2)
	step := float32(c.lr / c.bc1)
	bc2s := float32(math.Sqrt(c.bc2))
	eps := float32(c.eps)
	var lanes *cpu.AdamLanes
	if d.kpath().Asm() && !c.decoupled {
		lanes = new(cpu.AdamLanes)
		for i, v := range []float32{scale, wd, w1, b2, w2, step, bc2s, eps} {
			lanes[i] = [8]float32{v, v, v, v, v, v, v, v}
		}
	}
	return d.parallelFor(nil, len(pp), grainCheap/4, func(lo, hi int) {
		ps, gs, ms, vs := pp[lo:hi], gg[lo:hi], mm[lo:hi], vv[lo:hi]
		gs, ms, vs = gs[:len(ps)], ms[:len(ps)], vs[:len(ps)]
		if lanes != nil {
			done := cpu.AdamVec(ps, gs, ms, vs, lanes, wd != 0, d.kpath())
			ps, gs, ms, vs = ps[done:], gs[done:], ms[done:], vs[done:]
		}
		for i, pv := range ps {
			gv := gs[i]
			if scale != 1 {
				gv = float32(gv * scale)
			}
			if wd != 0 {
				if c.decoupled {
					pv = float32(float64(pv) * decay)
				} else {
					gv += float32(wd * pv)
				}
			}
			mv := ms[i] + float32(w1*(gv-ms[i]))
			vv := float32(b2*vs[i]) + float32(float32(w2*gv)*gv)
			ms[i], vs[i] = mv, vv
			den := float32(float32(math.Sqrt(float64(vv)))/bc2s) + eps
			ps[i] = pv - float32(step*float32(mv/den))
		}
	})
}

// sumSquares implements kernels.sumSquares.
func (d *cpuDevice) sumSquares(x *Tensor) (float64, error) {
	var s float64
	for _, v := range x.f32() {
		s += float64(v) * float64(v)
	}
	return s, nil
}

var _ Device = (*cpuDevice)(nil)
