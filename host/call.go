package host

import (
	"context"
	"fmt"
	"slices"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/sdk/wire"
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
	e, err := s.onDevice(uid, inputs, nil)
	if err == nil {
		err = e.schema.check(metas(inputs), nil, false)
	}
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	in, err := clone(e.Device(), inputs)
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	return e.Forward(ctx, in)
}

// Backward runs a backward request on expert uid within this process, as
// [Server.Forward] does a forward: the gradients of the inputs come back,
// and the expert's optimizer steps once per backward batch. The caller
// keeps inputs and gradOutputs.
func (s *Server) Backward(ctx context.Context, uid string, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.onDevice(uid, inputs, gradOutputs)
	if err == nil {
		err = e.schema.check(metas(inputs), metas(gradOutputs), true)
	}
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	in, err := clone(e.Device(), slices.Concat(inputs, gradOutputs))
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	return e.Backward(ctx, in[:len(inputs):len(inputs)], in[len(inputs):])
}

// onDevice finds a running expert for an in-process call whose tensors
// must all be tensors of the expert's device.
func (s *Server) onDevice(uid string, inputs, gradOutputs []*gpuhost.Tensor) (*expert, error) {
	e, err := s.running(uid)
	if err != nil {
		return nil, err
	}
	for i, t := range slices.Concat(inputs, gradOutputs) {
		what := fmt.Sprintf("input %d", i)
		if i >= len(inputs) {
			what = fmt.Sprintf("output gradient %d", i-len(inputs))
		}
		if t == nil || t.Device() != e.Device() {
			return nil, fmt.Errorf("%w: %s is not a tensor of the server's device", ErrBadTensors, what)
		}
	}
	return e, nil
}

// running finds a running expert.
func (s *Server) running(uid string) (*expert, error) {
	s.mu.Lock()
	e, ok := s.experts[uid]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: no expert %q on this server", ErrUnknownExpert, uid)
	}
	return e, nil
}

// metas is what the schema check reads of device tensors.
func metas(ts []*gpuhost.Tensor) []wire.Meta {
	out := make([]wire.Meta, len(ts))
	for i, t := range ts {
		shape := make([]int64, len(t.Shape()))
		for j, d := range t.Shape() {
			shape[j] = int64(d)
		}
		out[i] = wire.Meta{DType: t.DType(), Shape: shape}
	}
	return out
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
