package host

import (
	"context"
	"fmt"

	"github.com/moehost/moehost/gpuhost"
)

// Device returns the device the server's experts run on, on which the
// tensors of [Server.Forward] and [Server.Backward] must live; nil before
// Start. With several GPUs (WithDevice) it is the first, and an expert's
// tensors must live on the GPU it was assigned.
func (s *Server) Device() gpuhost.Device {
	devs := s.experts.Devices()
	if len(devs) == 0 {
		return nil
	}
	return devs[0]
}

// Forward runs a forward request on expert uid within this process: the
// same pool, batching, device worker and error mapping as a Forward RPC
// after decoding, without the wire. The inputs must be tensors of
// [Server.Device] that fit the expert's schema. The caller keeps its
// inputs and owns the outputs; it may hand both to the device's Release
// once done. (The pool takes the tensors it is given, so Forward gives it
// copies: see RATIONALE.)
func (s *Server) Forward(ctx context.Context, uid string, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.experts.Running(uid)
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", uid, err)
	}
	return e.ForwardDevice(ctx, inputs)
}

// Backward runs a backward request on expert uid within this process, as
// [Server.Forward] does a forward: the gradients of the inputs come back,
// and the expert's optimizer steps once per backward batch. The caller
// keeps inputs and gradOutputs.
func (s *Server) Backward(ctx context.Context, uid string, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	e, err := s.experts.Running(uid)
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", uid, err)
	}
	return e.BackwardDevice(ctx, inputs, gradOutputs)
}
