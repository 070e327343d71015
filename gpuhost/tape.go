package gpuhost

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
	// orphans are owned gradients dropped while other entries still
	// shared them; they are released at the end unless still in use.
	orphans []*Tensor
	// stop is the backward's context's Done channel: the kernels that
	// write the gradients look at it between chunks.
	stop <-chan struct{}
}

// zeros allocates a gradient that the backward's kernels will write.
func (s *gradSet) zeros(shape []int) (*Tensor, error) {
	return s.alloc(s.dev.Zeros, shape)
}

// scratch allocates a gradient that a kernel will overwrite whole (a GEMM
// that does not accumulate), without clearing it first.
func (s *gradSet) scratch(shape []int) (*Tensor, error) {
	return s.alloc(s.dev.allocDirty, shape)
}

// alloc allocates a gradient with alloc and gives it the backward's stop.
func (s *gradSet) alloc(alloc func(abi.DType, []int) (*Tensor, error), shape []int) (*Tensor, error) {
	t, err := alloc(abi.DTypeFloat32, shape)
	if err != nil {
		return nil, err
	}
	t.stop = s.stop
	return t, nil
}

// add adds g to t's gradient.
func (s *gradSet) add(t, g *Tensor, owned bool) error {
	e, ok := s.m[t]
	if !ok {
		s.m[t] = &grad{t: g, owned: owned}
		return nil
	}
	if !e.owned && owned && g.n == e.t.n {
		// Sum into g, which is ours, instead of into a copy of e.t.
		if err := s.dev.addRepeat(g, g, e.t); err != nil {
			return err
		}
		e.t, e.owned = g, true
		return nil
	}
	if !e.owned {
		c, err := s.clone(e.t)
		if err != nil {
			return err
		}
		e.t, e.owned = c, true
	}
	if err := s.dev.addRepeat(e.t, e.t, g); err != nil {
		return err
	}
	if owned && !s.shared(g) {
		s.dev.Release(g) // summed in; nobody else holds it
	}
	return nil
}

// shared reports whether an entry of s holds g's storage: g itself, or a
// view of it under another shape (reshape's backward passes its gradient
// on that way).
func (s *gradSet) shared(g *Tensor) bool {
	for _, e := range s.m {
		if sameStorage(e.t, g) {
			return true
		}
	}
	return false
}

// sameStorage reports whether a and b are views of one storage: the CPU's
// float32 slices start at one element, or another device's storage (a
// pointer to its buffer, never a slice) is one value.
func sameStorage(a, b *Tensor) bool {
	if a == b {
		return true
	}
	switch fa := a.mem.(type) {
	case []float32:
		fb := b.f32()
		return len(fa) > 0 && len(fb) > 0 && &fa[0] == &fb[0]
	case []byte, nil:
		return false
	}
	return a.mem == b.mem
}

// drop forgets t's gradient and releases it when s made it and no other
// entry holds it (an add passes its gradient on unowned).
func (s *gradSet) drop(t *Tensor) {
	e, ok := s.m[t]
	if !ok {
		return
	}
	delete(s.m, t)
	if e.owned {
		if s.shared(e.t) {
			s.orphans = append(s.orphans, e.t)
		} else {
			s.dev.Release(e.t)
		}
	}
}

// releaseOrphans releases the orphans that no entry and no result holds.
func (s *gradSet) releaseOrphans(results []*Tensor) {
	for _, o := range s.orphans {
		if s.shared(o) || slices.ContainsFunc(results, func(r *Tensor) bool { return sameStorage(r, o) }) {
			continue
		}
		s.dev.Release(o)
	}
	s.orphans = nil
}

func (s *gradSet) clone(t *Tensor) (*Tensor, error) {
	c, err := s.zeros(t.shape)
	if err != nil {
		return nil, err
	}
	return c, s.dev.copy(c, t)
}

// Release hands every tensor that the recorded ops made (their results and
// what they saved for the backward) back to dev, and empties the tape. Call
// it once the forward's results and Backward are done with; the gradients
// Backward returned are not the tape's and stay valid.
func (tp *Tape) Release(dev Device) {
	if tp == nil || dev == nil {
		return
	}
	for _, r := range tp.recs {
		dev.Release(r.outs...)
		dev.Release(r.internal()...)
	}
	tp.recs = nil
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
	return tp.BackwardContext(context.Background(), dev, outputs, gradOutputs, wrt)
}

// BackwardContext is [Tape.Backward] that gives up once ctx is done: it
// looks between ops, and the kernels look between chunks of about a
// millisecond, so that a backward outlives its deadline by no more than
// that. It then returns ctx's error and no gradients.
func (tp *Tape) BackwardContext(ctx context.Context, dev Device, outputs, gradOutputs, wrt []*Tensor) ([]*Tensor, error) {
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
		if !slices.Equal(outputs[i].shape, gradOutputs[i].shape) {
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
				for _, o := range r.outs {
					needs[o] = true
				}
				break
			}
		}
	}
	isWrt := make(map[*Tensor]bool, len(wrt))
	for _, t := range wrt {
		isWrt[t] = true
	}

	gs := &gradSet{dev: dev, m: make(map[*Tensor]*grad), stop: ctx.Done()}
	for i, o := range outputs {
		if needs[o] {
			if err := gs.add(o, gradOutputs[i], false); err != nil {
				return nil, fmt.Errorf("backward: %w", err)
			}
		}
	}
	for i := len(recs) - 1; i >= 0; i-- {
		r := recs[i]
		gys := make([]*Tensor, len(r.outs))
		some := false
		for j, o := range r.outs {
			if g, ok := gs.m[o]; ok {
				gys[j], some = g.t, true
			}
		}
		if !some {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("backward stopped before %s (op %d): %w", r.op, i, context.Cause(ctx))
		}
		if err := backwardOp(dev, gs, needs, r, gys); errors.Is(err, errStopped) {
			return nil, fmt.Errorf("backward stopped in %s (op %d): %w", r.op, i, context.Cause(ctx))
		} else if err != nil {
			return nil, fmt.Errorf("backward: %s (op %d): %w", r.op, i, err)
		}
		for _, o := range r.outs {
			if !isWrt[o] {
				gs.drop(o) // free it as early as a framework would
			}
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
	gs.releaseOrphans(res)
	for _, t := range res {
		t.stop = nil // the caller's now, past this backward's deadline
	}
	return res, nil
}

// reduceInto adds gy, summed over the leading dims that t was broadcast
// along, to t's gradient.
func reduceInto(dev Device, gs *gradSet, t, gy *Tensor) error {
	if slices.Equal(t.shape, gy.shape) {
		return gs.add(t, gy, false)
	}
	g, err := gs.zeros(t.shape)
	if err != nil {
		return err
	}
	if err := dev.sumRows(g, gy); err != nil {
		return err
	}
	return gs.add(t, g, true)
}
