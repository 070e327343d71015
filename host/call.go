package host

import (
	"context"
	"fmt"

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
// once done.
func (s *Server) Forward(ctx context.Context, uid string, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.callable(uid, inputs)
	if err != nil {
		return nil, err
	}
	return e.Forward(ctx, inputs)
}

// Backward runs a backward request on expert uid within this process, as
// [Server.Forward] does a forward: the gradients of the inputs come back,
// and the expert's optimizer steps once per backward batch.
func (s *Server) Backward(ctx context.Context, uid string, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.callable(uid, inputs)
	if err != nil {
		return nil, err
	}
	batch := inputs[0].Shape()[0]
	if len(gradOutputs) != len(e.outSpecs) {
		return nil, fmt.Errorf("%w: backward %q: got %d output gradients, want %d", ErrBadTensors, uid, len(gradOutputs), len(e.outSpecs))
	}
	for i, g := range gradOutputs {
		if n, err := sandbox.CheckInputs(e.outSpecs[i:i+1], []*gpuhost.Tensor{g}); err != nil || n != batch {
			return nil, fmt.Errorf("%w: backward %q: gradient of output %d does not fit %s with batch %d", ErrBadTensors, uid, i, e.outSpecs[i], batch)
		}
	}
	return e.Backward(ctx, inputs, gradOutputs)
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
	if _, err := sandbox.CheckInputs(e.inSpecs, inputs); err != nil {
		return nil, fmt.Errorf("%w: %q: %w", ErrBadTensors, uid, err)
	}
	return e, nil
}
