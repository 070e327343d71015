package gpuhost

import (
	"fmt"

	"github.com/moehost/moehost/abi"
)

// Tape records the ops of one forward pass, in order, so that Backward can
// run them in reverse. A Tape is used by one goroutine at a time. It keeps
// every recorded tensor alive until it is dropped.
type Tape struct {
	recs []*record
}

// NewTape returns an empty tape.
func NewTape() *Tape { return &Tape{} }

// Len returns the number of recorded ops.
func (tp *Tape) Len() int {
	if tp == nil {
		return 0
	}
	return len(tp.recs)
}

// grad is one tensor's gradient so far. A gradient that is not owned is
// shared (the caller's gradOutput, or another tensor's gradient passed
// through an add) and is copied before anything is added to it.
type grad struct {
	t     *Tensor
	owned bool
}

// gradSet accumulates gradients by tensor.
type gradSet struct {
	dev Device
	m   map[*Tensor]*grad
}

// add adds g to t's gradient.
func (s *gradSet) add(t, g *Tensor, owned bool) error {
	e, ok := s.m[t]
	if !ok {
		s.m[t] = &grad{t: g, owned: owned}
		return nil
	}
	if !e.owned {
		c, err := s.clone(e.t)
		if err != nil {
			return err
		}
		e.t, e.owned = c, true
	}
	return s.dev.addRepeat(e.t, e.t, g)
}

func (s *gradSet) clone(t *Tensor) (*Tensor, error) {
	c, err := s.dev.Zeros(abi.DTypeFloat32, t.shape)
	if err != nil {
		return nil, err
	}
	return c, s.dev.copy(c, t)
}

// Backward computes the vector-Jacobian product of the recorded ops: the
// gradients of Σᵢ ⟨outputs[i], gradOutputs[i]⟩ with respect to each tensor
// in wrt, returned in wrt's order. Tensors are identified by pointer. A wrt
// tensor that no recorded op reached gets zeros; a tensor used by several
// ops gets the sum of their contributions. gradOutputs[i] must have
// outputs[i]'s shape (ErrShape otherwise). The returned tensors are new and
// owned by the caller. Backward does not change the tape, so it may run
// again with other gradOutputs.
func (tp *Tape) Backward(dev Device, outputs, gradOutputs, wrt []*Tensor) ([]*Tensor, error) {
	if dev == nil {
		return nil, fmt.Errorf("%w: backward: nil device", ErrArgument)
	}
	if len(outputs) != len(gradOutputs) {
		return nil, fmt.Errorf("%w: backward: %d outputs but %d output gradients", ErrArgument, len(outputs), len(gradOutputs))
	}
	for i := range outputs {
		if err := checkFloat(dev, outputs[i]); err != nil {
			return nil, fmt.Errorf("%w: backward: output %d: %w", ErrArgument, i, err)
		}
		if err := checkFloat(dev, gradOutputs[i]); err != nil {
			return nil, fmt.Errorf("%w: backward: output gradient %d: %w", ErrArgument, i, err)
		}
		if !sameShape(outputs[i].shape, gradOutputs[i].shape) {
			return nil, fmt.Errorf("%w: backward: output %d is %v but its gradient is %v",
				ErrShape, i, outputs[i].shape, gradOutputs[i].shape)
		}
	}
	// needs holds the wrt tensors and everything computed from them: only
	// their gradients are worth computing.
	needs := make(map[*Tensor]bool, len(wrt))
	for i, t := range wrt {
		if err := checkFloat(dev, t); err != nil {
			return nil, fmt.Errorf("%w: backward: wrt %d: %w", ErrArgument, i, err)
		}
		needs[t] = true
	}
	var recs []*record
	if tp != nil {
		recs = tp.recs
	}
	for _, r := range recs {
		for _, a := range r.args {
			if needs[a] {
				needs[r.out] = true
				break
			}
		}
	}
	isWrt := make(map[*Tensor]bool, len(wrt))
	for _, t := range wrt {
		isWrt[t] = true
	}

	gs := &gradSet{dev: dev, m: make(map[*Tensor]*grad)}
	for i, o := range outputs {
		if needs[o] {
			if err := gs.add(o, gradOutputs[i], false); err != nil {
				return nil, fmt.Errorf("backward: %w", err)
			}
		}
	}
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		g, ok := gs.m[r.out]
		if !ok {
			continue
		}
		if err := backwardOp(dev, gs, needs, r, g.t); err != nil {
			return nil, fmt.Errorf("backward: %s (op %d): %w", r.op, i, err)
		}
		if !isWrt[r.out] {
			delete(gs.m, r.out) // free it as early as a framework would
		}
	}

	res := make([]*Tensor, len(wrt))
	given := make(map[*Tensor]bool, len(wrt))
	for i, t := range wrt {
		var err error
		e, ok := gs.m[t]
		switch {
		case !ok:
			res[i], err = dev.Zeros(abi.DTypeFloat32, t.shape)
		case !e.owned || given[e.t]:
			res[i], err = gs.clone(e.t)
		default:
			res[i] = e.t
		}
		if err != nil {
			return nil, fmt.Errorf("backward: %w", err)
		}
		given[res[i]] = true
	}
	return res, nil
}

// backwardOp adds the gradients of r's args that are needed, given gy, the
// gradient of r's output.
func backwardOp(dev Device, gs *gradSet, needs map[*Tensor]bool, r *record, gy *Tensor) error {
	a := r.args
	// newGrad allocates a gradient shaped like arg i.
	newGrad := func(i int) (*Tensor, error) { return dev.Zeros(abi.DTypeFloat32, a[i].shape) }
	// gemmInto computes a gradient for arg i with one GEMM.
	gemmInto := func(i int, ta, tb bool, m, n, k int, x, y *Tensor) error {
		if !needs[a[i]] {
			return nil
		}
		g, err := newGrad(i)
		if err != nil {
			return err
		}
		if err := dev.gemm(ta, tb, m, n, k, x, y, g, false); err != nil {
			return err
		}
		return gs.add(a[i], g, true)
	}
	switch r.op {
	case abi.OpMatMul:
		// C = op(A)·op(B): dop(A) = gC·op(B)ᵀ and dop(B) = op(A)ᵀ·gC,
		// transposed back when the arg was stored transposed.
		m, n, k := r.m, r.n, r.k
		var err error
		if !r.ta {
			err = gemmInto(0, false, !r.tb, m, k, n, gy, a[1])
		} else {
			err = gemmInto(0, r.tb, true, k, m, n, a[1], gy)
		}
		if err != nil {
			return err
		}
		if !r.tb {
			return gemmInto(1, !r.ta, false, k, n, m, a[0], gy)
		}
		return gemmInto(1, true, r.ta, n, k, m, gy, a[0])
	case abi.OpLinear:
		// y = x·Wᵀ + b: dx = gy·W, dW = gyᵀ·x, db = Σ_rows gy.
		m, n, k := r.m, r.n, r.k
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
	case abi.OpAdd:
		big, small := a[0], a[1]
		if r.swapped {
			big, small = small, big
		}
		if needs[big] {
			if err := gs.add(big, gy, false); err != nil {
				return err
			}
		}
		if needs[small] {
			return reduceInto(dev, gs, small, gy)
		}
		return nil
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
		var gt [3]*Tensor
		some := false
		for i := range gt {
			if needs[a[i]] {
				var err error
				if gt[i], err = newGrad(i); err != nil {
					return err
				}
				some = true
			}
		}
		if !some {
			return nil
		}
		if err := dev.layerNormBackward(gt[0], gt[1], gt[2], a[0], a[1], r.mean, r.rstd, gy); err != nil {
			return err
		}
		for i, g := range gt {
			if g != nil {
				if err := gs.add(a[i], g, true); err != nil {
					return err
				}
			}
		}
		return nil
	}
	panic("BUG: backward of unknown op " + r.op.String())
}

// reduceInto adds gy, summed over the leading dims that t was broadcast
// along, to t's gradient.
func reduceInto(dev Device, gs *gradSet, t, gy *Tensor) error {
	if sameShape(t.shape, gy.shape) {
		return gs.add(t, gy, false)
	}
	g, err := dev.Zeros(abi.DTypeFloat32, t.shape)
	if err != nil {
		return err
	}
	if err := dev.sumRows(g, gy); err != nil {
		return err
	}
	return gs.add(t, g, true)
}
