package gpuhost

import (
	"slices"

	"github.com/moehost/moehost/abi"
)

// backwardOp adds the gradients of r's args that are needed, given gys, the
// gradients of r's outputs; gys[i] is nil for an output that no gradient
// reached, and at least one is not nil.
func backwardOp(dev Device, gs *gradSet, needs map[*Tensor]bool, r *record, gys []*Tensor) error {
	a := r.args
	gy := gys[0]
	// newGrad allocates a gradient shaped like arg i.
	newGrad := func(i int) (*Tensor, error) { return gs.zeros(a[i].shape) }
	// gemmInto computes a gradient for arg i with one GEMM, which writes
	// all of it.
	gemmInto := func(i int, ta, tb bool, m, n, k int, x, y *Tensor) error {
		if !needs[a[i]] {
			return nil
		}
		g, err := gs.scratch(a[i].shape)
		if err != nil {
			return err
		}
		if err := dev.gemm(ta, tb, m, n, k, x, y, g, false); err != nil {
			return err
		}
		return gs.add(a[i], g, true)
	}
	// bmmInto computes a gradient for arg i, which holds ni matrices,
	// with one batch GEMM.
	bmmInto := func(i, ni, batch int, ta, tb bool, m, n, k int, x *Tensor, nx int, y *Tensor, ny int) error {
		if !needs[a[i]] {
			return nil
		}
		g, err := gs.scratch(a[i].shape)
		if err != nil {
			return err
		}
		if err := dev.bmm(ta, tb, batch, m, n, k, x, nx, y, ny, g, ni, false); err != nil {
			return err
		}
		return gs.add(a[i], g, true)
	}
	// gradsFor allocates gradients for those of the first n args that need
	// one; it returns nil when none does.
	gradsFor := func(n int) ([]*Tensor, error) {
		gt := make([]*Tensor, n)
		some := false
		for i := range gt {
			if needs[a[i]] {
				var err error
				if gt[i], err = newGrad(i); err != nil {
					return nil, err
				}
				some = true
			}
		}
		if !some {
			return nil, nil
		}
		return gt, nil
	}
	if fn, ok := unaryOps[r.op]; ok {
		if !needs[a[0]] {
			return nil
		}
		if fn == unaryAddScalar {
			return gs.add(a[0], gy, false)
		}
		g, err := newGrad(0)
		if err != nil {
			return err
		}
		if err := dev.unaryBackward(fn, r.attrs.(*scalarAttrs).p, g, a[0], r.outs[0], gy); err != nil {
			return err
		}
		return gs.add(a[0], g, true)
	}
	if fn, ok := binaryOps[r.op]; ok {
		return binaryBackward(dev, gs, needs, r, fn, gy)
	}
	if fn, ok := reduceOps[r.op]; ok {
		if !needs[a[0]] {
			return nil
		}
		g, err := newGrad(0)
		if err != nil {
			return err
		}
		at := r.attrs.(*axisAttrs)
		if err := dev.reduceAxisBackward(fn, g, gy, at.arg, at.outer, at.dim, at.inner); err != nil {
			return err
		}
		return gs.add(a[0], g, true)
	}
	switch r.op {
	case abi.OpMatMul:
		// C = op(A)·op(B): dop(A) = gC·op(B)ᵀ and dop(B) = op(A)ᵀ·gC,
		// transposed back when the arg was stored transposed.
		at := r.attrs.(*matAttrs)
		m, n, k := at.m, at.n, at.k
		var err error
		if !at.ta {
			err = gemmInto(0, false, !at.tb, m, k, n, gy, a[1])
		} else {
			err = gemmInto(0, at.tb, true, k, m, n, a[1], gy)
		}
		if err != nil {
			return err
		}
		if !at.tb {
			return gemmInto(1, !at.ta, false, k, n, m, a[0], gy)
		}
		return gemmInto(1, true, at.ta, n, k, m, gy, a[0])
	case abi.OpBatchMatMul:
		// As matmul, per batch; a gradient of a broadcast arg sums over
		// the batches that reused it.
		at := r.attrs.(*bmmAttrs)
		m, n, k, bt := at.m, at.n, at.k, at.batch
		var err error
		if !at.ta {
			err = bmmInto(0, at.na, bt, false, !at.tb, m, k, n, gy, bt, a[1], at.nb)
		} else {
			err = bmmInto(0, at.na, bt, at.tb, true, k, m, n, a[1], at.nb, gy, bt)
		}
		if err != nil {
			return err
		}
		if !at.tb {
			return bmmInto(1, at.nb, bt, !at.ta, false, k, n, m, a[0], at.na, gy, bt)
		}
		return bmmInto(1, at.nb, bt, true, at.ta, n, k, m, gy, bt, a[0], at.na)
	case abi.OpLinear, abi.OpLinearGeluTanh:
		at := r.attrs.(*matAttrs)
		if r.op == abi.OpLinearGeluTanh {
			if !needs[a[0]] && !needs[a[1]] && (len(a) < 3 || !needs[a[2]]) {
				return nil
			}
			// Through gelu first: gz = gy·gelu'(z) with z the kept
			// pre-activation; the set frees gz once nothing shares it.
			gz, err := gs.zeros(r.outs[0].shape)
			if err != nil {
				return err
			}
			gs.orphans = append(gs.orphans, gz)
			if err := dev.geluBackward(gz, at.pre, gy); err != nil {
				return err
			}
			gy = gz
		}
		// y = x·Wᵀ + b: dx = gy·W, dW = gyᵀ·x, db = Σ_rows gy.
		m, n, k := at.m, at.n, at.k
		if err := gemmInto(0, false, false, m, k, n, gy, a[1]); err != nil {
			return err
		}
		if err := gemmInto(1, true, false, n, k, m, gy, a[0]); err != nil {
			return err
		}
		if len(a) == 3 && needs[a[2]] {
			return reduceInto(dev, gs, a[2], gy)
		}
		return nil
	case abi.OpAddLayerNorm:
		// The layer_norm's gradients with the kept sum as its x; the sum's
		// gradient then flows to x and r as through add.
		at := r.attrs.(*normAttrs)
		big, small := a[0], a[1]
		if at.swapped {
			big, small = small, big
		}
		gt := make([]*Tensor, 4)
		var gsum *Tensor
		if needs[big] || needs[small] {
			var err error
			if gsum, err = gs.zeros(at.pre.shape); err != nil {
				return err
			}
			gs.orphans = append(gs.orphans, gsum)
		}
		for i := 2; i < 4; i++ {
			if needs[a[i]] {
				var err error
				if gt[i], err = newGrad(i); err != nil {
					return err
				}
			}
		}
		if gsum == nil && gt[2] == nil && gt[3] == nil {
			return nil
		}
		if err := dev.layerNormBackward(gsum, gt[2], gt[3], at.pre, a[2], at.mean, at.rstd, gy); err != nil {
			return err
		}
		if err := addAll(gs, a, gt); err != nil {
			return err
		}
		return addBackward(dev, gs, needs, big, small, gsum)
	case abi.OpAdd:
		big, small := a[0], a[1]
		if r.attrs.(*binaryAttrs).swapped {
			big, small = small, big
		}
		return addBackward(dev, gs, needs, big, small, gy)
	case abi.OpGeluTanh:
		if !needs[a[0]] {
			return nil
		}
		g, err := newGrad(0)
		if err != nil {
			return err
		}
		if err := dev.geluBackward(g, a[0], gy); err != nil {
			return err
		}
		return gs.add(a[0], g, true)
	case abi.OpLayerNorm:
		gt, err := gradsFor(3)
		if gt == nil || err != nil {
			return err
		}
		at := r.attrs.(*normAttrs)
		if err := dev.layerNormBackward(gt[0], gt[1], gt[2], a[0], a[1], at.mean, at.rstd, gy); err != nil {
			return err
		}
		return addAll(gs, a, gt)
	case abi.OpRMSNorm:
		gt, err := gradsFor(2)
		if gt == nil || err != nil {
			return err
		}
		if err := dev.rmsNormBackward(gt[0], gt[1], a[0], a[1], r.attrs.(*normAttrs).rstd, gy); err != nil {
			return err
		}
		return addAll(gs, a, gt)
	case abi.OpSoftmax, abi.OpLogSoftmax:
		if !needs[a[0]] {
			return nil
		}
		g, err := newGrad(0)
		if err != nil {
			return err
		}
		at := r.attrs.(*axisAttrs)
		if err := dev.softmaxBackward(g, r.outs[0], gy, at.outer, at.dim, at.inner, r.op == abi.OpLogSoftmax); err != nil {
			return err
		}
		return gs.add(a[0], g, true)
	case abi.OpDropout:
		// The mask is an input but gets no gradient.
		if !needs[a[0]] {
			return nil
		}
		g, err := newGrad(0)
		if err != nil {
			return err
		}
		if err := dev.binary(binaryMul, g, gy, a[1]); err != nil {
			return err
		}
		if err := dev.unary(unaryScale, 1/r.attrs.(*scalarAttrs).p, g, g); err != nil {
			return err
		}
		return gs.add(a[0], g, true)
	case abi.OpEmbedding:
		if !needs[a[1]] {
			return nil
		}
		g, err := newGrad(1)
		if err != nil {
			return err
		}
		if err := dev.embeddingBackward(g, a[0], gy); err != nil {
			return err
		}
		return gs.add(a[1], g, true)
	case abi.OpCrossEntropy:
		return crossEntropyBackward(dev, gs, needs, r, gy)
	case abi.OpAttention:
		gt, err := gradsFor(3)
		if gt == nil || err != nil {
			return err
		}
		at := r.attrs.(*attentionAttrs)
		if err := dev.attentionBackward(gt[0], gt[1], gt[2], a[0], a[1], a[2], at.probs, gy, at.dims); err != nil {
			return err
		}
		return addAll(gs, a, gt)
	case abi.OpCast:
		// Only a float32 x can need a gradient (the wrt tensors are
		// float32): its cast is a copy, whose gradient is gy.
		if !needs[a[0]] {
			return nil
		}
		return gs.add(a[0], gy, false)
	case abi.OpReshape:
		if !needs[a[0]] {
			return nil
		}
		// The gradient is gy's storage under x's shape; it is shared, so
		// the set copies it before adding to it.
		return gs.add(a[0], gy.view(a[0].shape), false)
	case abi.OpPermute, abi.OpTranspose:
		if !needs[a[0]] {
			return nil
		}
		perm := r.attrs.(*permAttrs).perm
		inv := make([]int, len(perm))
		for i, p := range perm {
			inv[p] = i
		}
		g, err := newGrad(0)
		if err != nil {
			return err
		}
		if err := dev.permute(g, gy, inv); err != nil {
			return err
		}
		return gs.add(a[0], g, true)
	case abi.OpConcat:
		at := r.attrs.(*sectionAttrs)
		off := 0
		for i, t := range a {
			w := at.sizes[i] * at.inner
			if needs[t] {
				g, err := newGrad(i)
				if err != nil {
					return err
				}
				if err := dev.copy2D(g, 0, w, gy, off, at.dim*at.inner, at.outer, w); err != nil {
					return err
				}
				if err := gs.add(t, g, true); err != nil {
					return err
				}
			}
			off += w
		}
		return nil
	case abi.OpSlice, abi.OpSplit:
		if !needs[a[0]] {
			return nil
		}
		g, err := newGrad(0)
		if err != nil {
			return err
		}
		at := r.attrs.(*sectionAttrs)
		off := at.start * at.inner
		for i, gi := range gys {
			w := at.sizes[i] * at.inner
			if gi != nil {
				if err := dev.copy2D(g, off, at.dim*at.inner, gi, 0, w, at.outer, w); err != nil {
					return err
				}
			}
			off += w
		}
		return gs.add(a[0], g, true)
	}
	panic("BUG: backward of unknown op " + r.op.String())
}

// addAll adds each non-nil gradient in gt to the arg at its index.
func addAll(gs *gradSet, args, gt []*Tensor) error {
	for i, g := range gt {
		if g != nil {
			if err := gs.add(args[i], g, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// addBackward gives the gradient g of big + small (small repeated over
// big's leading dims) to the operands that need one: big takes g as it
// is, small its sum over the repeats.
func addBackward(dev Device, gs *gradSet, needs map[*Tensor]bool, big, small, g *Tensor) error {
	if needs[big] {
		if err := gs.add(big, g, false); err != nil {
			return err
		}
	}
	if needs[small] {
		return reduceInto(dev, gs, small, g)
	}
	return nil
}

// binaryBackward adds the gradients of sub, mul and div:
// d(a−b) = (gy, −gy), d(a·b) = (gy·b, gy·a), d(a/b) = (gy/b, −gy·y/b),
// each summed over the leading dims its arg was broadcast along.
func binaryBackward(dev Device, gs *gradSet, needs map[*Tensor]bool, r *record, fn binaryFn, gy *Tensor) error {
	a, b, y := r.args[0], r.args[1], r.outs[0]
	full := func() (*Tensor, error) { return gs.zeros(gy.shape) }
	if needs[a] {
		switch fn {
		case binarySub:
			if err := reduceInto(dev, gs, a, gy); err != nil {
				return err
			}
		case binaryMul, binaryDiv:
			g, err := full()
			if err != nil {
				return err
			}
			if err := dev.binary(fn, g, gy, b); err != nil {
				return err
			}
			if err := reduceNew(dev, gs, a, g); err != nil {
				return err
			}
		}
	}
	if !needs[b] {
		return nil
	}
	g, err := full()
	if err != nil {
		return err
	}
	switch fn {
	case binarySub:
		err = dev.unary(unaryNeg, 0, g, gy)
	case binaryMul:
		err = dev.binary(binaryMul, g, gy, a)
	case binaryDiv:
		if err = dev.binary(binaryMul, g, gy, y); err == nil {
			if err = dev.binary(binaryDiv, g, g, b); err == nil {
				err = dev.unary(unaryNeg, 0, g, g)
			}
		}
	}
	if err != nil {
		return err
	}
	return reduceNew(dev, gs, b, g)
}

// crossEntropyBackward turns gy into a per-row gradient and runs the
// kernel.
func crossEntropyBackward(dev Device, gs *gradSet, needs map[*Tensor]bool, r *record, gy *Tensor) error {
	logits := r.args[0]
	if !needs[logits] {
		return nil
	}
	at := r.attrs.(*crossEntropyAttrs)
	rows := gy
	if at.reduction != 0 {
		var err error
		if rows, err = gs.zeros([]int{logits.shape[0]}); err != nil {
			return err
		}
		if err := dev.addRepeat(rows, rows, gy); err != nil {
			return err
		}
		if at.reduction == 1 && at.count > 0 {
			if err := dev.unary(unaryScale, 1/float64(at.count), rows, rows); err != nil {
				return err
			}
		}
	}
	g, err := gs.zeros(logits.shape)
	if err != nil {
		return err
	}
	if err := dev.crossEntropyBackward(g, logits, at.lse, r.args[1], rows, at.ignore); err != nil {
		return err
	}
	return gs.add(logits, g, true)
}

// reduceNew is reduceInto for a gradient g that the caller made and hands
// over.
func reduceNew(dev Device, gs *gradSet, t, g *Tensor) error {
	if slices.Equal(t.shape, g.shape) {
		return gs.add(t, g, true)
	}
	return reduceInto(dev, gs, t, g)
}
