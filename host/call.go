package host

import (
	"context"
	"fmt"
	"slices"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// Device returns the device the server's experts run on, on which the
// tensors of [Server.Forward] and [Server.Backward] must live; nil before
// Start. With several GPUs (WithDevice) it is the first, and an expert's
// tensors must live on the GPU it was assigned.
func (s *Server) Device() gpuhost.Device {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lanes) == 0 {
		return nil
	}
	return s.lanes[0].dev
}

// Forward runs a forward request on expert uid within this process: the
// same pool, batching, device worker and error mapping as a Forward RPC
// after decoding, without the wire. The inputs must be tensors of
// [Server.Device] that fit the expert's schema. The caller keeps its
// inputs and owns the outputs; it may hand both to the device's Release
// once done. (The pool takes the tensors it is given, so Forward gives it
// copies: see RATIONALE.)
func (s *Server) Forward(ctx context.Context, uid string, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.callable(uid, inputs)
	if err != nil {
		return nil, err
	}
	in, err := clone(e.Device(), inputs)
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	return e.Forward(ctx, in)
}

// forwardOwned is Forward for a caller that hands its inputs over: they
// are released whatever happens, without a copy.
func (s *Server) forwardOwned(ctx context.Context, uid string, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.callable(uid, inputs)
	if err != nil {
		releaseOwn(inputs)
		return nil, err
	}
	return e.Forward(ctx, inputs)
}

// Backward runs a backward request on expert uid within this process, as
// [Server.Forward] does a forward: the gradients of the inputs come back,
// and the expert's optimizer steps once per backward batch. The caller
// keeps inputs and gradOutputs.
func (s *Server) Backward(ctx context.Context, uid string, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.backwardable(uid, inputs, gradOutputs)
	if err != nil {
		return nil, err
	}
	in, err := clone(e.Device(), slices.Concat(inputs, gradOutputs))
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	return e.Backward(ctx, in[:len(inputs):len(inputs)], in[len(inputs):])
}

// backwardOwned is Backward for a caller that hands its tensors over.
func (s *Server) backwardOwned(ctx context.Context, uid string, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.backwardable(uid, inputs, gradOutputs)
	if err != nil {
		releaseOwn(slices.Concat(inputs, gradOutputs))
		return nil, err
	}
	return e.Backward(ctx, inputs, gradOutputs)
}

// backwardable finds a running expert and checks a backward request's
// tensors against its schema.
func (s *Server) backwardable(uid string, inputs, gradOutputs []*gpuhost.Tensor) (*expert, error) {
	e, err := s.callable(uid, inputs)
	if err != nil {
		return nil, err
	}
	batch := inputs[0].Shape()[0]
	if len(gradOutputs) != len(e.schema.outSpecs) {
		return nil, fmt.Errorf("%w: backward %q: got %d output gradients, want %d", ErrBadTensors, uid, len(gradOutputs), len(e.schema.outSpecs))
	}
	for i, g := range gradOutputs {
		if g == nil || g.Device() != e.Device() {
			return nil, fmt.Errorf("%w: backward %q: output gradient %d is not a tensor of the server's device", ErrBadTensors, uid, i)
		}
		if n, err := sandbox.CheckInputs(e.schema.outSpecs[i:i+1], []*gpuhost.Tensor{g}); err != nil || n != batch {
			return nil, fmt.Errorf("%w: backward %q: gradient of output %d does not fit %s with batch %d", ErrBadTensors, uid, i, e.schema.outSpecs[i], batch)
		}
	}
	return e, nil
}

// clone copies tensors for a pool to take, releasing the copies made so
// far if one fails. Every tensor has a batch dimension (the schema checked
// it), so a one-tensor Concat copies it.
func clone(dev gpuhost.Device, ts []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	out := make([]*gpuhost.Tensor, len(ts))
	for i, t := range ts {
		c, err := dev.Concat([]*gpuhost.Tensor{t})
		if err != nil {
			dev.Release(out[:i]...)
			return nil, fmt.Errorf("copying tensor %d: %w", i, err)
		}
		out[i] = c
	}
	return out, nil
}

// releaseOwn releases tensors handed over with a request that was refused
// before any expert took them, on whichever device each lives.
func releaseOwn(ts []*gpuhost.Tensor) {
	for _, t := range ts {
		if t != nil && t.Device() != nil {
			t.Device().Release(t)
		}
	}
}

// callable finds a running expert and checks inputs against its schema,
// as the RPC layer does while decoding.
func (s *Server) callable(uid string, inputs []*gpuhost.Tensor) (*expert, error) {
	s.mu.Lock()
	e, ok := s.experts[uid]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: no expert %q on this server", ErrUnknownExpert, uid)
	}
	for i, t := range inputs {
		if t == nil || t.Device() != e.Device() {
			return nil, fmt.Errorf("%w: %q: input %d is not a tensor of the server's device", ErrBadTensors, uid, i)
		}
	}
	if _, err := sandbox.CheckInputs(e.schema.inSpecs, inputs); err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrBadTensors, uid, err)
	}
	return e, nil
}
