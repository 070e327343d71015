package gpuhost_test

import (
	"math"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/internal/testing/ref"
)

// This file holds the float64 references of ops 6–36, written from their
// definitions in abi/op.go. Like ref_ext_test.go it calls nothing in
// gpuhost. Ids, targets and masks arrive as float64 values.

// refAttr returns attrs[i] or def.
func refAttr(attrs []float64, i int, def float64) float64 {
	if i < len(attrs) {
		return attrs[i]
	}
	return def
}

// refAxis normalises a possibly negative axis.
func refAxis(a float64, rank int) int {
	ax := int(a)
	if ax < 0 {
		ax += rank
	}
	return ax
}

// refBinary applies f with leading-dim broadcasting: the smaller operand
// repeats over the larger's leading dims.
func refBinary(a, b []float64, f func(x, y float64) float64) []float64 {
	n := max(len(a), len(b))
	y := make([]float64, n)
	for i := range y {
		y[i] = f(a[i%len(a)], b[i%len(b)])
	}
	return y
}

// refMap applies f elementwise.
func refMap(x []float64, f func(float64) float64) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = f(v)
	}
	return y
}

func refSigmoid(v float64) float64 { return 1 / (1 + math.Exp(-v)) }

// strides returns the row-major strides of shape.
func strides(shape []int) []int {
	s := make([]int, len(shape))
	st := 1
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = st
		st *= shape[i]
	}
	return s
}

// unravel returns the multi-index of flat index i in shape.
func unravel(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		idx[d] = i % shape[d]
		i /= shape[d]
	}
	return idx
}

// refLines calls f for every line along axis of shape with the flat
// indices of the line's elements.
func refLines(shape []int, axis int, f func(idx []int)) {
	st := strides(shape)
	n := numel(shape)
	for i := range n {
		mi := unravel(i, shape)
		if mi[axis] != 0 {
			continue
		}
		idx := make([]int, shape[axis])
		for j := range idx {
			idx[j] = i + j*st[axis]
		}
		f(idx)
	}
}

// refSoftmax is softmax (or log-softmax) along axis.
func refSoftmax(x []float64, shape []int, axis int, log bool) []float64 {
	y := make([]float64, len(x))
	refLines(shape, axis, func(idx []int) {
		var s float64
		for _, i := range idx {
			s += math.Exp(x[i])
		}
		for _, i := range idx {
			if log {
				y[i] = x[i] - math.Log(s)
			} else {
				y[i] = math.Exp(x[i]) / s
			}
		}
	})
	return y
}

// refReduce reduces along axis with f over the line's values.
func refReduce(x []float64, shape []int, axis int, f func(v []float64) float64) []float64 {
	var y []float64
	refLines(shape, axis, func(idx []int) {
		v := make([]float64, len(idx))
		for j, i := range idx {
			v[j] = x[i]
		}
		y = append(y, f(v))
	})
	return y
}

// refRMSNorm is x/√(mean(x²)+eps)·w over rows of len(w).
func refRMSNorm(x, w []float64, eps float64) []float64 {
	h := len(w)
	y := make([]float64, len(x))
	for r := 0; r < len(x)/h; r++ {
		var q float64
		for _, v := range x[r*h : (r+1)*h] {
			q += v * v
		}
		s := math.Sqrt(q/float64(h) + eps)
		for i := range h {
			y[r*h+i] = x[r*h+i] / s * w[i]
		}
	}
	return y
}

// refPermute returns x with dims reordered: out dim i is x's dim perm[i].
func refPermute(x []float64, shape, perm []int) []float64 {
	oshape := make([]int, len(perm))
	for i, p := range perm {
		oshape[i] = shape[p]
	}
	st := strides(shape)
	y := make([]float64, len(x))
	for o := range y {
		mi := unravel(o, oshape)
		src := 0
		for i, p := range perm {
			src += mi[i] * st[p]
		}
		y[o] = x[src]
	}
	return y
}

// refSliceAxis returns x[start:end] along axis.
func refSliceAxis(x []float64, shape []int, axis, start, end int) []float64 {
	var y []float64
	for i, v := range x {
		if mi := unravel(i, shape); mi[axis] >= start && mi[axis] < end {
			y = append(y, v)
		}
	}
	return y
}

// refConcat joins args along axis.
func refConcat(args [][]float64, shapes [][]int, axis int) []float64 {
	oshape := append([]int{}, shapes[0]...)
	oshape[axis] = 0
	for _, s := range shapes {
		oshape[axis] += s[axis]
	}
	y := make([]float64, numel(oshape))
	off := 0
	for a, x := range args {
		ost := strides(oshape)
		for i, v := range x {
			mi := unravel(i, shapes[a])
			mi[axis] += off
			o := 0
			for d, m := range mi {
				o += m * ost[d]
			}
			y[o] = v
		}
		off += shapes[a][axis]
	}
	return y
}

// refBMM multiplies per batch with broadcasting of the leading dims.
func refBMM(a []float64, as []int, b []float64, bs []int, ta, tb bool) []float64 {
	ma, mb := as[len(as)-2:], bs[len(bs)-2:]
	sa, sb := ma[0]*ma[1], mb[0]*mb[1]
	na, nb := len(a)/sa, len(b)/sb
	var y []float64
	for i := range max(na, nb) {
		y = append(y, refMatMul(a[(i%na)*sa:(i%na+1)*sa], ma, b[(i%nb)*sb:(i%nb+1)*sb], mb, ta, tb)...)
	}
	return y
}

// refCrossEntropy follows torch.nn.functional.cross_entropy.
func refCrossEntropy(x []float64, n, c int, t []float64, red int, ignore float64) []float64 {
	loss := make([]float64, n)
	count := 0
	for r := range n {
		if t[r] == ignore {
			continue
		}
		count++
		var s float64
		for j := range c {
			s += math.Exp(x[r*c+j])
		}
		loss[r] = math.Log(s) - x[r*c+int(t[r])]
	}
	if red == 0 {
		return loss
	}
	var s float64
	for _, v := range loss {
		s += v
	}
	if red == 1 {
		s /= float64(count)
	}
	return []float64{s}
}

// refAttention is softmax(q·kᵀ·scale + masks)·v with zeros for rows whose
// keys are all masked. mask is nil or [B,Tk] with 1 for padding.
func refAttention(q, k, v, mask []float64, qs, ks, vs []int, causal bool, scale float64) []float64 {
	b, h, tq, d := qs[0], qs[1], qs[2], qs[3]
	tk, dv := ks[2], vs[3]
	if scale == 0 {
		scale = 1 / math.Sqrt(float64(d))
	}
	out := make([]float64, b*h*tq*dv)
	for bi := range b {
		for hi := range h {
			qo, ko, vo := ((bi*h+hi)*tq)*d, ((bi*h+hi)*tk)*d, ((bi*h+hi)*tk)*dv
			for i := range tq {
				w := make([]float64, tk)
				var s float64
				for j := range tk {
					if (causal && j > i+tk-tq) || (mask != nil && mask[bi*tk+j] != 0) {
						continue
					}
					var dot float64
					for e := range d {
						dot += q[qo+i*d+e] * k[ko+j*d+e]
					}
					w[j] = math.Exp(dot * scale)
					s += w[j]
				}
				if s == 0 {
					continue
				}
				for j := range tk {
					for e := range dv {
						out[((bi*h+hi)*tq+i)*dv+e] += w[j] / s * v[vo+j*dv+e]
					}
				}
			}
		}
	}
	return out
}

// refOpExt is refOp for ops 6–36; ok is false for ops it does not know.
func refOpExt(op abi.Op, args [][]float64, shapes [][]int, attrs []float64) (y []float64, ok bool) {
	x, xs := args[0], shapes[0]
	switch op {
	case abi.OpLinearGeluTanh:
		var b []float64
		if len(args) == 3 {
			b = args[2]
		}
		return ref.GeluTanh(ref.Linear(x, args[1], b, shapes[1][1], shapes[1][0])), true
	case abi.OpAddLayerNorm:
		return ref.LayerNorm(ref.Add(args[0], args[1]), args[2], args[3], refAttr(attrs, 0, 1e-5)), true
	case abi.OpSub:
		return refBinary(args[0], args[1], func(a, b float64) float64 { return a - b }), true
	case abi.OpMul:
		return refBinary(args[0], args[1], func(a, b float64) float64 { return a * b }), true
	case abi.OpDiv:
		return refBinary(args[0], args[1], func(a, b float64) float64 { return a / b }), true
	case abi.OpScale:
		s := refAttr(attrs, 0, 1)
		return refMap(x, func(v float64) float64 { return s * v }), true
	case abi.OpAddScalar:
		c := refAttr(attrs, 0, 0)
		return refMap(x, func(v float64) float64 { return v + c }), true
	case abi.OpRelu:
		return refMap(x, func(v float64) float64 { return math.Max(v, 0) }), true
	case abi.OpGelu:
		return refMap(x, func(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }), true
	case abi.OpTanh:
		return refMap(x, math.Tanh), true
	case abi.OpSigmoid:
		return refMap(x, refSigmoid), true
	case abi.OpSilu:
		return refMap(x, func(v float64) float64 { return v * refSigmoid(v) }), true
	case abi.OpExp:
		return refMap(x, math.Exp), true
	case abi.OpLog:
		return refMap(x, math.Log), true
	case abi.OpSqrt:
		return refMap(x, math.Sqrt), true
	case abi.OpNeg:
		return refMap(x, func(v float64) float64 { return -v }), true
	case abi.OpSoftmax, abi.OpLogSoftmax:
		return refSoftmax(x, xs, refAxis(refAttr(attrs, 0, -1), len(xs)), op == abi.OpLogSoftmax), true
	case abi.OpRMSNorm:
		return refRMSNorm(x, args[1], refAttr(attrs, 0, 1e-6)), true
	case abi.OpReshape:
		return append([]float64(nil), x...), true
	case abi.OpPermute:
		perm := make([]int, len(attrs))
		for i, a := range attrs {
			perm[i] = refAxis(a, len(xs))
		}
		return refPermute(x, xs, perm), true
	case abi.OpTranspose:
		perm := make([]int, len(xs))
		for i := range perm {
			perm[i] = i
		}
		d0, d1 := refAxis(attrs[0], len(xs)), refAxis(attrs[1], len(xs))
		perm[d0], perm[d1] = d1, d0
		return refPermute(x, xs, perm), true
	case abi.OpConcat:
		return refConcat(args, shapes, refAxis(refAttr(attrs, 0, 0), len(xs))), true
	case abi.OpSlice:
		return refSliceAxis(x, xs, refAxis(attrs[0], len(xs)), int(attrs[1]), int(attrs[2])), true
	case abi.OpSplit:
		axis := refAxis(attrs[0], len(xs))
		var y []float64
		start := 0
		for _, s := range attrs[1:] {
			y = append(y, refSliceAxis(x, xs, axis, start, start+int(s))...)
			start += int(s)
		}
		return y, true
	case abi.OpSum, abi.OpMean, abi.OpMax:
		return refReduce(x, xs, refAxis(refAttr(attrs, 0, -1), len(xs)), func(v []float64) float64 {
			var s float64
			switch op {
			case abi.OpMax:
				s = math.Inf(-1)
				for _, e := range v {
					s = math.Max(s, e)
				}
			default:
				for _, e := range v {
					s += e
				}
				if op == abi.OpMean {
					s /= float64(len(v))
				}
			}
			return s
		}), true
	case abi.OpCast: // ids and bools arrive as their float64 values
		return append([]float64(nil), x...), true
	case abi.OpDropout:
		kp := refAttr(attrs, 0, 1)
		return refBinary(x, args[1], func(a, m float64) float64 { return a * m / kp }), true
	case abi.OpEmbedding:
		table, d := args[1], shapes[1][1]
		var y []float64
		for _, id := range x {
			y = append(y, table[int(id)*d:(int(id)+1)*d]...)
		}
		return y, true
	case abi.OpCrossEntropy:
		return refCrossEntropy(x, xs[0], xs[1], args[1], int(refAttr(attrs, 0, 0)), refAttr(attrs, 1, -100)), true
	case abi.OpBatchMatMul:
		return refBMM(x, xs, args[1], shapes[1], refAttr(attrs, 0, 0) == 1, refAttr(attrs, 1, 0) == 1), true
	case abi.OpAttention:
		var mask []float64
		if len(args) == 4 {
			mask = args[3]
		}
		return refAttention(x, args[1], args[2], mask, xs, shapes[1], shapes[2], refAttr(attrs, 0, 0) == 1, refAttr(attrs, 1, 0)), true
	}
	return nil, false
}
