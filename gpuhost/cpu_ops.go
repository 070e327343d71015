package gpuhost

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost/internal/cpu"
)

// unary implements kernels.unary. Transcendental functions run in float64.
func (d *cpuDevice) unary(fn unaryFn, p float64, y, x *Tensor) error {
	o, in := y.f32(), x.f32()
	grain := grainTanh
	if fn <= unaryRelu || fn == unaryNeg {
		grain = grainCheap
	}
	return d.parallelFor(y.stop, len(in), grain, func(lo, hi int) {
		oo, xx := o[lo:hi], in[lo:hi]
		oo = oo[:len(xx)]
		switch fn {
		case unaryScale:
			s := float32(p)
			for i, v := range xx {
				oo[i] = s * v
			}
		case unaryAddScalar:
			c := float32(p)
			for i, v := range xx {
				oo[i] = v + c
			}
		case unaryRelu:
			for i, v := range xx {
				oo[i] = max(v, 0)
			}
		case unaryNeg:
			for i, v := range xx {
				oo[i] = -v
			}
		default:
			for i, v := range xx {
				oo[i] = float32(unaryF64(fn, float64(v)))
			}
		}
	})
}

// unaryF64 evaluates the transcendental unary functions.
func unaryF64(fn unaryFn, x float64) float64 {
	switch fn {
	case unaryGelu:
		return 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
	case unaryTanh:
		return math.Tanh(x)
	case unarySigmoid:
		return sigmoid(x)
	case unarySilu:
		return x * sigmoid(x)
	case unaryExp:
		return math.Exp(x)
	case unaryLog:
		return math.Log(x)
	case unarySqrt:
		return math.Sqrt(x)
	}
	panic("BUG: unaryF64 of a cheap function")
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// unaryBackward implements kernels.unaryBackward.
func (d *cpuDevice) unaryBackward(fn unaryFn, p float64, gx, x, y, gy *Tensor) error {
	o, in, out, g := gx.f32(), x.f32(), y.f32(), gy.f32()
	return d.parallelFor(gx.stop, len(in), grainTanh, func(lo, hi int) {
		oo, xx, yy, gg := o[lo:hi], in[lo:hi], out[lo:hi], g[lo:hi]
		oo, yy, gg = oo[:len(xx)], yy[:len(xx)], gg[:len(xx)]
		for i, v := range xx {
			xv, yv, gv := float64(v), float64(yy[i]), float64(gg[i])
			var dy float64
			switch fn {
			case unaryScale:
				dy = p
			case unaryAddScalar:
				dy = 1
			case unaryNeg:
				dy = -1
			case unaryRelu:
				if xv > 0 {
					dy = 1
				}
			case unaryGelu:
				// Φ(x) + x·φ(x).
				dy = 0.5*(1+math.Erf(xv/math.Sqrt2)) + xv*math.Exp(-0.5*xv*xv)/math.Sqrt(2*math.Pi)
			case unaryTanh:
				dy = 1 - yv*yv
			case unarySigmoid:
				dy = yv * (1 - yv)
			case unarySilu:
				s := sigmoid(xv)
				dy = s * (1 + xv*(1-s))
			case unaryExp:
				dy = yv
			case unaryLog:
				dy = 1 / xv
			case unarySqrt:
				dy = 0.5 / yv
			}
			oo[i] = float32(gv * dy)
		}
	})
}

// binary implements kernels.binary. The smaller operand repeats along
// dst; each chunk of dst is walked in runs that stay within one repeat, so
// that every run is a plain zip, and chunks are elements, not repeats, so
// that one huge repeat still stops between chunks.
func (d *cpuDevice) binary(fn binaryFn, dst, a, b *Tensor) error {
	o, x, y := dst.f32(), a.f32(), b.f32()
	n := len(o)
	return d.parallelFor(dst.stop, n, grainCheap, func(lo, hi int) {
		for lo < hi {
			end, xs, ys := hi, lo, lo
			if len(x) < n {
				xs = lo % len(x)
				end = min(end, lo-xs+len(x))
			}
			if len(y) < n {
				ys = lo % len(y)
				end = min(end, lo-ys+len(y))
			}
			oo := o[lo:end]
			xx, yy := x[xs:xs+len(oo)], y[ys:ys+len(oo)]
			switch fn {
			case binaryAdd:
				for i := range oo {
					oo[i] = xx[i] + yy[i]
				}
			case binarySub:
				for i := range oo {
					oo[i] = xx[i] - yy[i]
				}
			case binaryMul:
				for i := range oo {
					oo[i] = xx[i] * yy[i]
				}
			case binaryDiv:
				for i := range oo {
					oo[i] = xx[i] / yy[i]
				}
			}
			lo = end
		}
	})
}

// softmax implements kernels.softmax in float64 per row.
func (d *cpuDevice) softmax(y, x *Tensor, outer, dim, inner int, log bool) error {
	o, in := y.f32(), x.f32()
	return d.parallelFor(y.stop, outer*inner, max(1, grainTanh/dim), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			base := (r/inner)*dim*inner + r%inner
			m := math.Inf(-1)
			for j0 := 0; j0 < dim; j0 += rowStep {
				if j0 > 0 && stopped(y.stop) {
					return
				}
				for j := j0; j < min(dim, j0+rowStep); j++ {
					m = max(m, float64(in[base+j*inner]))
				}
			}
			// The vector exponentials take contiguous rows whose max is
			// finite (NaN and ±Inf keep the Go arithmetic's results).
			vec := d.kpath().Asm() && inner == 1 && !math.IsInf(m, 0) && !math.IsNaN(m)
			var s float64
			for j0 := 0; j0 < dim; j0 += rowStep {
				if j0 > 0 && stopped(y.stop) {
					return
				}
				if vec {
					s += cpu.ExpSum(in[base+j0:base+min(dim, j0+rowStep)], m, d.kpath())
					continue
				}
				for j := j0; j < min(dim, j0+rowStep); j++ {
					s += math.Exp(float64(in[base+j*inner]) - m)
				}
			}
			if log {
				ls := m + math.Log(s)
				for j0 := 0; j0 < dim; j0 += rowStep {
					if j0 > 0 && stopped(y.stop) {
						return
					}
					for j := j0; j < min(dim, j0+rowStep); j++ {
						o[base+j*inner] = float32(float64(in[base+j*inner]) - ls)
					}
				}
				continue
			}
			for j0 := 0; j0 < dim; j0 += rowStep {
				if j0 > 0 && stopped(y.stop) {
					return
				}
				if vec {
					j1 := base + min(dim, j0+rowStep)
					cpu.ExpScale(o[base+j0:j1], in[base+j0:j1], m, s, d.kpath())
					continue
				}
				for j := j0; j < min(dim, j0+rowStep); j++ {
					o[base+j*inner] = float32(math.Exp(float64(in[base+j*inner])-m) / s)
				}
			}
		}
	})
}

// softmaxBackward implements kernels.softmaxBackward: softmax gives
// gx = y·(gy − Σ gy·y), log-softmax gx = gy − e^y·Σ gy.
func (d *cpuDevice) softmaxBackward(gx, y, gy *Tensor, outer, dim, inner int, log bool) error {
	o, out, g := gx.f32(), y.f32(), gy.f32()
	return d.parallelFor(gx.stop, outer*inner, max(1, grainTanh/dim), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			base := (r/inner)*dim*inner + r%inner
			// Contiguous softmax rows take the vector kernels (log-softmax's
			// e^y stays in Go).
			vec := d.kpath().Asm() && inner == 1 && !log
			var s float64
			for j0 := 0; j0 < dim; j0 += rowStep {
				if j0 > 0 && stopped(gx.stop) {
					return
				}
				if vec {
					j1 := base + min(dim, j0+rowStep)
					s += cpu.DotF64(g[base+j0:j1], out[base+j0:j1], d.kpath())
					continue
				}
				for j := j0; j < min(dim, j0+rowStep); j++ {
					i := base + j*inner
					if log {
						s += float64(g[i])
					} else {
						s += float64(g[i]) * float64(out[i])
					}
				}
			}
			for j0 := 0; j0 < dim; j0 += rowStep {
				if j0 > 0 && stopped(gx.stop) {
					return
				}
				if vec {
					j1 := base + min(dim, j0+rowStep)
					cpu.SoftmaxGrad(o[base+j0:j1], out[base+j0:j1], g[base+j0:j1], s, d.kpath())
					continue
				}
				for j := j0; j < min(dim, j0+rowStep); j++ {
					i := base + j*inner
					if log {
						o[i] = float32(float64(g[i]) - math.Exp(float64(out[i]))*s)
					} else {
						o[i] = float32(float64(out[i]) * (float64(g[i]) - s))
					}
				}
			}
		}
	})
}

// rmsNormForward implements kernels.rmsNormForward.
func (d *cpuDevice) rmsNormForward(y, rstd, x, w *Tensor, eps float64) error {
	o, in, ww, rs := y.f32(), x.f32(), w.f32(), rstd.f32()
	h := len(ww)
	return d.parallelFor(y.stop, len(rs), max(1, grainCheap/h), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			xr, or := in[r*h:(r+1)*h], o[r*h:(r+1)*h]
			var q float64
			for _, v := range xr {
				q += float64(v) * float64(v)
			}
			inv := 1 / math.Sqrt(q/float64(h)+eps)
			rs[r] = float32(inv)
			for i, v := range xr {
				or[i] = float32(float64(v)*inv) * ww[i]
			}
		}
	})
}

// rmsNormBackward implements kernels.rmsNormBackward:
// gx = r·gy·w − r³/H·x·Σ gy·w·x, gw = Σ_rows gy·x·r.
func (d *cpuDevice) rmsNormBackward(gx, gw, x, w, rstd, gy *Tensor) error {
	in, ww, rs, g := x.f32(), w.f32(), rstd.f32(), gy.f32()
	h, rows := len(ww), len(rs)
	if gx != nil {
		o := gx.f32()
		if err := d.parallelFor(gx.stop, rows, max(1, grainCheap/h), func(lo, hi int) {
			for r := lo; r < hi; r++ {
				xr, gr, or := in[r*h:(r+1)*h], g[r*h:(r+1)*h], o[r*h:(r+1)*h]
				inv := float64(rs[r])
				var s float64
				for i, v := range xr {
					s += float64(gr[i]) * float64(ww[i]) * float64(v)
				}
				c := inv * inv * inv * s / float64(h)
				for i, v := range xr {
					or[i] = float32(inv*float64(gr[i])*float64(ww[i]) - c*float64(v))
				}
			}
		}); err != nil {
			return err
		}
	}
	if gw == nil {
		return nil
	}
	o := gw.f32()
	return d.parallelFor(gradStop(gw), h, max(1, grainCheap/rows), func(lo, hi int) {
		acc := make([]float64, hi-lo)
		for r := range rows {
			inv := float64(rs[r])
			xr, gr := in[r*h+lo:r*h+hi], g[r*h+lo:r*h+hi]
			for i, v := range xr {
				acc[i] += float64(gr[i]) * float64(v) * inv
			}
		}
		for i, v := range acc {
			o[lo+i] = float32(v)
		}
	})
}

// permute implements kernels.permute. It walks dst by rows of its last dim
// and reads src with the matching stride.
func (d *cpuDevice) permute(dst, src *Tensor, perm []int) error {
	o, in := dst.f32(), src.f32()
	rank := len(perm)
	if rank == 0 {
		o[0] = in[0]
		return nil
	}
	sstr := make([]int, rank) // src strides
	st := 1
	for i := rank - 1; i >= 0; i-- {
		sstr[i] = st
		st *= src.shape[i]
	}
	dshape := dst.shape
	pstr := make([]int, rank) // src stride of each dst dim
	for i, p := range perm {
		pstr[i] = sstr[p]
	}
	last := dshape[rank-1]
	ls := pstr[rank-1]
	rows := len(o) / last
	return d.parallelFor(dst.stop, rows, max(1, grainCheap/last), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			// The src offset of dst row r.
			off, rem := 0, r
			for i := rank - 2; i >= 0; i-- {
				off += (rem % dshape[i]) * pstr[i]
				rem /= dshape[i]
			}
			or := o[r*last : (r+1)*last]
			for j := range or {
				or[j] = in[off+j*ls]
			}
		}
	})
}

// copy2D implements kernels.copy2D.
func (d *cpuDevice) copy2D(dst *Tensor, dOff, dStride int, src *Tensor, sOff, sStride, rows, width int) error {
	o, in := dst.f32(), src.f32()
	return d.parallelFor(dst.stop, rows, max(1, grainCheap/width), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			copy(o[dOff+r*dStride:dOff+r*dStride+width], in[sOff+r*sStride:sOff+r*sStride+width])
		}
	})
}

// reduceAxis implements kernels.reduceAxis; sums run in float64.
func (d *cpuDevice) reduceAxis(fn reduceFn, dst, arg, src *Tensor, outer, dim, inner int) error {
	o, in := dst.f32(), src.f32()
	var idx []byte // little-endian int32 arg-max indices
	if arg != nil {
		idx = arg.mem.([]byte)
	}
	return d.parallelFor(dst.stop, outer*inner, max(1, grainCheap/dim), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			base := (r/inner)*dim*inner + r%inner
			switch fn {
			case reduceMax:
				best, at := in[base], 0
				for j0 := 1; j0 < dim; j0 += rowStep {
					if j0 > 1 && stopped(dst.stop) {
						return
					}
					for j := j0; j < min(dim, j0+rowStep); j++ {
						v := in[base+j*inner]
						if v > best || (v != v && best == best) {
							best, at = v, j
						}
					}
				}
				o[r] = best
				binary.LittleEndian.PutUint32(idx[4*r:], uint32(at))
			default:
				var s float64
				for j0 := 0; j0 < dim; j0 += rowStep {
					if j0 > 0 && stopped(dst.stop) {
						return
					}
					for j := j0; j < min(dim, j0+rowStep); j++ {
						s += float64(in[base+j*inner])
					}
				}
				if fn == reduceMean {
					s /= float64(dim)
				}
				o[r] = float32(s)
			}
		}
	})
}

// reduceAxisBackward implements kernels.reduceAxisBackward.
func (d *cpuDevice) reduceAxisBackward(fn reduceFn, gx, gy, arg *Tensor, outer, dim, inner int) error {
	o, g := gx.f32(), gy.f32()
	var idx []byte
	if arg != nil {
		idx = arg.mem.([]byte)
	}
	return d.parallelFor(gx.stop, outer*inner, max(1, grainCheap/dim), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			base := (r/inner)*dim*inner + r%inner
			switch fn {
			case reduceMax:
				for j := range dim {
					o[base+j*inner] = 0
				}
				o[base+int(binary.LittleEndian.Uint32(idx[4*r:]))*inner] = g[r]
			case reduceMean:
				v := float32(float64(g[r]) / float64(dim))
				for j := range dim {
					o[base+j*inner] = v
				}
			default:
				for j := range dim {
					o[base+j*inner] = g[r]
				}
			}
		}
	})
}

// idAt returns the i-th id of an int32 or int64 tensor.
func idAt(t *Tensor, b []byte, i int) int64 {
	if t.dt == abi.DTypeInt32 {
		return int64(int32(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return int64(binary.LittleEndian.Uint64(b[8*i:]))
}

// embedding implements kernels.embedding.
func (d *cpuDevice) embedding(y, ids, table *Tensor) error {
	b := ids.mem.([]byte)
	v, dd := table.shape[0], table.shape[1]
	for i := range ids.n {
		if id := idAt(ids, b, i); id < 0 || id >= int64(v) {
			return fmt.Errorf("%w: embedding: id %d at index %d of ids %s is outside [0, %d) for table %v", ErrArgument, id, i, ids.desc(), v, table.shape)
		}
	}
	o, tb := y.f32(), table.f32()
	return d.parallelFor(y.stop, ids.n, max(1, grainCheap/dd), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			id := int(idAt(ids, b, i))
			copy(o[i*dd:(i+1)*dd], tb[id*dd:(id+1)*dd])
		}
	})
}

// embeddingBackward implements kernels.embeddingBackward. Columns are
// split across threads, so rows that share an id never race.
func (d *cpuDevice) embeddingBackward(gtable, ids, gy *Tensor) error {
	b := ids.mem.([]byte)
	dd := gtable.shape[1]
	o, g := gtable.f32(), gy.f32()
	return d.parallelFor(gtable.stop, dd, max(1, grainCheap/ids.n), func(lo, hi int) {
		for i := range ids.n {
			id := int(idAt(ids, b, i))
			or, gr := o[id*dd+lo:id*dd+hi], g[i*dd+lo:i*dd+hi]
			for j, v := range gr {
				or[j] += v
			}
		}
	})
}

// cast implements kernels.cast. Go's integer-to-float conversion rounds
// to nearest, ties to even, as torch's does.
func (d *cpuDevice) cast(dst, src *Tensor) error {
	b, o := src.mem.([]byte), dst.f32()
	return d.parallelFor(dst.stop, dst.n, grainCheap, func(lo, hi int) {
		switch src.dt {
		case abi.DTypeInt32:
			for i := lo; i < hi; i++ {
				o[i] = float32(int32(binary.LittleEndian.Uint32(b[4*i:])))
			}
		case abi.DTypeInt64:
			for i := lo; i < hi; i++ {
				o[i] = float32(int64(binary.LittleEndian.Uint64(b[8*i:])))
			}
		default: // bool
			for i := lo; i < hi; i++ {
				o[i] = 0
				if b[i] != 0 {
					o[i] = 1
				}
			}
		}
	})
}

// crossEntropy implements kernels.crossEntropy.
func (d *cpuDevice) crossEntropy(loss, lse, logits, targets *Tensor, ignore int64) (int, error) {
	b := targets.mem.([]byte)
	n, c := logits.shape[0], logits.shape[1]
	count := 0
	for r := range n {
		t := idAt(targets, b, r)
		if t == ignore {
			continue
		}
		if t < 0 || t >= int64(c) {
			return 0, fmt.Errorf("%w: cross_entropy: target %d of row %d is outside [0, %d) and is not ignore_index %d (logits %v)", ErrArgument, t, r, c, ignore, logits.shape)
		}
		count++
	}
	x, l, ls := logits.f32(), loss.f32(), lse.f32()
	if err := d.parallelFor(loss.stop, n, max(1, grainTanh/c), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			row := x[r*c : (r+1)*c]
			m := math.Inf(-1)
			for _, v := range row {
				m = max(m, float64(v))
			}
			var s float64
			for _, v := range row {
				s += math.Exp(float64(v) - m)
			}
			e := m + math.Log(s)
			ls[r] = float32(e)
			if t := idAt(targets, b, r); t != ignore {
				l[r] = float32(e - float64(row[t]))
			} else {
				l[r] = 0
			}
		}
	}); err != nil {
		return 0, err
	}
	return count, nil
}

// crossEntropyBackward implements kernels.crossEntropyBackward.
func (d *cpuDevice) crossEntropyBackward(gx, logits, lse, targets, gy *Tensor, ignore int64) error {
	b := targets.mem.([]byte)
	n, c := logits.shape[0], logits.shape[1]
	o, x, ls, g := gx.f32(), logits.f32(), lse.f32(), gy.f32()
	return d.parallelFor(gx.stop, n, max(1, grainTanh/c), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			or := o[r*c : (r+1)*c]
			t := idAt(targets, b, r)
			if t == ignore {
				clear(or)
				continue
			}
			gr, e := float64(g[r]), float64(ls[r])
			for j, v := range x[r*c : (r+1)*c] {
				or[j] = float32(gr * math.Exp(float64(v)-e))
			}
			or[t] -= float32(gr)
		}
	})
}

// bmm implements kernels.bmm. Each c matrix is one task; the batches that
// add into it run in order on that task, so there are no races.
func (d *cpuDevice) bmm(ta, tb bool, batch, m, n, k int, a *Tensor, na int, b *Tensor, nb int, c *Tensor, nc int, acc bool) error {
	x, y, z := a.f32(), b.f32(), c.f32()
	sa, sb, sc := m*k, k*n, m*n
	return d.parallelFor(c.stop, nc, max(1, cpu.MinWork/max(1, sa*n*(batch/nc))), func(lo, hi int) {
		for j := lo; j < hi; j++ {
			cj := z[j*sc : (j+1)*sc]
			first := !acc
			for i := j; i < batch && !stopped(c.stop); i += nc {
				ai, bi := i%na, i%nb
				d.gemmStop(c.stop, ta, tb, m, n, k, x[ai*sa:(ai+1)*sa], y[bi*sb:(bi+1)*sb], cj, !first, nil)
				first = false
			}
		}
	})
}

// attention implements kernels.attention, one (batch, head) per task:
// S = q·kᵀ·scale with masked entries −Inf, P = softmax(S), out = P·v.
func (d *cpuDevice) attention(out, probs, q, k, v, mask *Tensor, a attnDims) error {
	qq, kk, vv, pp, oo := q.f32(), k.f32(), v.f32(), probs.f32(), out.f32()
	var mb []byte
	if mask != nil {
		mb = mask.mem.([]byte)
	}
	sq, sk, sv, sp, so := a.tq*a.d, a.tk*a.d, a.tk*a.dv, a.tq*a.tk, a.tq*a.dv
	work := a.tq * a.tk * (a.d + a.dv)
	return d.parallelFor(out.stop, a.b*a.h, max(1, cpu.MinWork/max(1, work)), func(lo, hi int) {
		for bh := lo; bh < hi && !stopped(out.stop); bh++ {
			p := pp[bh*sp : (bh+1)*sp]
			d.gemmStop(out.stop, false, true, a.tq, a.tk, a.d, qq[bh*sq:(bh+1)*sq], kk[bh*sk:(bh+1)*sk], p, false, nil)
			var mrow []byte
			if mb != nil {
				b := bh / a.h
				mrow = mb[b*a.tk : (b+1)*a.tk]
			}
			for i := range a.tq {
				if stopped(out.stop) { // a row is tk exps: the long part of a wide head
					return
				}
				row := p[i*a.tk : (i+1)*a.tk]
				lim := a.tk // keys j < lim are visible
				if a.causal {
					lim = max(0, min(a.tk, i+a.tk-a.tq+1))
				}
				m := math.Inf(-1)
				for j := range row {
					if j >= lim || (mrow != nil && mrow[j] != 0) {
						continue
					}
					m = max(m, float64(row[j])*a.scale)
				}
				if math.IsInf(m, -1) { // every key masked
					clear(row)
					continue
				}
				var s float64
				for j, x := range row {
					if j >= lim || (mrow != nil && mrow[j] != 0) {
						row[j] = 0
						continue
					}
					e := math.Exp(float64(x)*a.scale - m)
					row[j] = float32(e)
					s += e
				}
				inv := 1 / s
				for j := range row {
					row[j] = float32(float64(row[j]) * inv)
				}
			}
			d.gemmStop(out.stop, false, false, a.tq, a.dv, a.tk, p, vv[bh*sv:(bh+1)*sv], oo[bh*so:(bh+1)*so], false, nil)
		}
	})
}

// attentionBackward implements kernels.attentionBackward:
// gv = Pᵀ·gout, dP = gout·vᵀ, dS = P·(dP − rowsum(dP·P))·scale,
// gq = dS·k, gk = dSᵀ·q.
func (d *cpuDevice) attentionBackward(gq, gk, gv, q, k, v, probs, gout *Tensor, a attnDims) error {
	qq, kk, vv, pp, g := q.f32(), k.f32(), v.f32(), probs.f32(), gout.f32()
	sq, sk, sv, sp, so := a.tq*a.d, a.tk*a.d, a.tk*a.dv, a.tq*a.tk, a.tq*a.dv
	work := a.tq * a.tk * (a.d + a.dv)
	stop := gradStop(gq, gk, gv)
	return d.parallelFor(stop, a.b*a.h, max(1, cpu.MinWork/max(1, 2*work)), func(lo, hi int) {
		ds := make([]float32, sp)
		for bh := lo; bh < hi && !stopped(stop); bh++ {
			p, gb := pp[bh*sp:(bh+1)*sp], g[bh*so:(bh+1)*so]
			if gv != nil {
				d.gemmStop(stop, true, false, a.tk, a.dv, a.tq, p, gb, gv.f32()[bh*sv:(bh+1)*sv], false, nil)
			}
			if gq == nil && gk == nil {
				continue
			}
			d.gemmStop(stop, false, true, a.tq, a.tk, a.dv, gb, vv[bh*sv:(bh+1)*sv], ds, false, nil)
			for i := range a.tq {
				if stopped(stop) {
					return
				}
				pr, dr := p[i*a.tk:(i+1)*a.tk], ds[i*a.tk:(i+1)*a.tk]
				var s float64
				for j, x := range pr {
					s += float64(x) * float64(dr[j])
				}
				for j, x := range pr {
					dr[j] = float32(float64(x) * (float64(dr[j]) - s) * a.scale)
				}
			}
			if gq != nil {
				d.gemmStop(stop, false, false, a.tq, a.d, a.tk, ds, kk[bh*sk:(bh+1)*sk], gq.f32()[bh*sq:(bh+1)*sq], false, nil)
			}
			if gk != nil {
				d.gemmStop(stop, true, false, a.tk, a.d, a.tq, ds, qq[bh*sq:(bh+1)*sq], gk.f32()[bh*sk:(bh+1)*sk], false, nil)
			}
		}
	})
}
