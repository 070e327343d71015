package experts

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/sdk/wire"
)

// The one way in for tensors. Every path (Connect, hivemind's wire, an
// in-process call) hands a request's tensors to an expert through
// admitTensors: the one schema check, then admission of their bytes
// against the device's memory limit before anything is allocated, then
// each tensor made on the device, and on any failure the ones made so far
// released. The pools take what it returns. Results leave through
// wireOut, its inverse.

// Wire is a tensor as a wire carries it (sdk/wire's Raw): its dtype as
// sent (float16 or bfloat16 may stand for a float32 input, and are
// widened on the way in), its shape, whose first dimension is the batch,
// and its little-endian bytes, checked here against the schema and the
// shape.
type Wire = wire.Raw

// deviceBytes is what w takes on the device: a float16 or bfloat16 one
// twice its wire bytes, once widened to float32.
func deviceBytes(w Wire) int64 {
	n := int64(len(w.Data))
	if half.Is(w.DType) {
		n *= 2
	}
	return n
}

// toDevice makes w, of the given shape, on dev, widening a float16 or
// bfloat16 one.
func toDevice(dev gpuhost.Device, w Wire, shape []int) (*gpuhost.Tensor, error) {
	if !half.Is(w.DType) {
		return dev.FromBytes(w.DType, shape, w.Data)
	}
	f, err := wire.Decode(w.DType, w.Data)
	if err != nil {
		return nil, err
	}
	return dev.FromFloat32(shape, f)
}

// badTensors marks an error as the caller's tensors' fault
// (ErrBadTensors) without changing its message, which names the tensor
// and what its schema wants.
type badTensors struct{ err error }

func (b badTensors) Error() string        { return b.err.Error() }
func (b badTensors) Unwrap() error        { return b.err }
func (b badTensors) Is(target error) bool { return target == ErrBadTensors }

// admitTensors is the one ingress. n tensors of a request, inputs first,
// then (for a backward) output gradients, described by metas for the
// schema check and bytes for admission, are made on dev by mk, in
// order. On failure every tensor made is released and the error says
// whose fault it is: ErrBadTensors for tensors that do not fit or do not
// convert, gpuhost.ErrOutOfMemory for the memory limit.
func (e *Expert) admitTensors(inputs, gradOutputs []wire.Meta, backward bool, bytes int64, mk func(i int) (*gpuhost.Tensor, error)) ([]*gpuhost.Tensor, error) {
	if err := e.schema.check(inputs, gradOutputs, backward); err != nil {
		return nil, err
	}
	dev := e.Device()
	// Admission: a request whose tensors would leave too little of the
	// memory limit for the work already running is refused whole,
	// before anything is allocated.
	if err := dev.Admit(bytes); err != nil {
		return nil, fmt.Errorf("the request's %d tensor bytes: %w", bytes, err)
	}
	n := len(inputs) + len(gradOutputs)
	out := make([]*gpuhost.Tensor, n)
	for i := range n {
		t, err := mk(i)
		if err != nil {
			dev.Release(out[:i]...)
			what := fmt.Sprintf("input %d", i)
			if i >= len(inputs) {
				what = fmt.Sprintf("grad_output %d", i-len(inputs))
			}
			if errors.Is(err, gpuhost.ErrOutOfMemory) {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
			return nil, badTensors{fmt.Errorf("%s: %w", what, err)}
		}
		out[i] = t
	}
	return out, nil
}

// wireIn admits wire tensors: once they fit the schema, each one's bytes
// must match its shape.
func (e *Expert) wireIn(inputs, gradOutputs []Wire, backward bool) ([]*gpuhost.Tensor, error) {
	var inline [4]wire.Meta // most experts take a tensor or two
	metas := inline[:0]
	var bytes int64
	for _, ws := range [...][]Wire{inputs, gradOutputs} {
		for _, w := range ws {
			metas = append(metas, w.Meta())
			bytes += deviceBytes(w)
		}
	}
	dev := e.Device()
	return e.admitTensors(metas[:len(inputs)], metas[len(inputs):], backward, bytes, func(i int) (*gpuhost.Tensor, error) {
		// The schema check passed: each tensor has its declared spec.
		var (
			w    Wire
			spec *moehostv1.TensorSchema
		)
		if i < len(inputs) {
			w, spec = inputs[i], e.schema.inputs[i]
		} else {
			j := i - len(inputs)
			w, spec = gradOutputs[j], e.schema.outputs[j]
		}
		shape, err := w.Dims(spec)
		if err != nil {
			return nil, err
		}
		return toDevice(dev, w, shape)
	})
}

// wireOut is the ingress's inverse: it copies results off the device into
// wire tensors, narrowing float32 ones to dt when it is float16 or
// bfloat16, and releases the results.
func (e *Expert) wireOut(ts []*gpuhost.Tensor, dt abi.DType) ([]Wire, error) {
	dev := e.Device()
	defer dev.Release(ts...)
	out := make([]Wire, len(ts))
	for i, t := range ts {
		w := Wire{DType: t.DType(), Shape: wire.Dims64(t.Shape())}
		if t.DType() == abi.DTypeFloat32 && half.Is(dt) {
			f, err := dev.Float32s(t)
			if err != nil {
				return nil, fmt.Errorf("reading output %d: %w", i, err)
			}
			w.DType, w.Data = dt, wire.Encode(dt, f)
		} else {
			w.Data = make([]byte, t.ByteSize())
			if err := dev.ReadBytes(t, w.Data); err != nil {
				return nil, fmt.Errorf("reading output %d: %w", i, err)
			}
		}
		out[i] = w
	}
	return out, nil
}

// ForwardWire runs a forward request whose inputs came off a wire, and
// returns its outputs for the wire, float32 ones as outDType (float32,
// float16 or bfloat16).
func (e *Expert) ForwardWire(ctx context.Context, inputs []Wire, outDType abi.DType) ([]Wire, error) {
	in, err := e.wireIn(inputs, nil, false)
	if err != nil {
		return nil, err
	}
	outs, err := e.submitForward(ctx, in)
	if err != nil {
		return nil, err
	}
	return e.wireOut(outs, outDType)
}

// BackwardWire is ForwardWire for a backward request: it returns the
// inputs' gradients, float32 ones as gradDType.
func (e *Expert) BackwardWire(ctx context.Context, inputs, gradOutputs []Wire, gradDType abi.DType) ([]Wire, error) {
	in, err := e.wireIn(inputs, gradOutputs, true)
	if err != nil {
		return nil, err
	}
	grads, err := e.submitBackward(ctx, in[:len(inputs):len(inputs)], in[len(inputs):])
	if err != nil {
		return nil, err
	}
	return e.wireOut(grads, gradDType)
}

// ForwardDevice runs an in-process forward request on tensors of the
// expert's device: the same ingress as a wire's (one schema check,
// admission), with copies made for the pool to take, so that the caller
// keeps its tensors. The outputs are the caller's to release. Refusals
// at the door name the call ("forward \"ffn.0\": ...").
func (e *Expert) ForwardDevice(ctx context.Context, inputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	in, err := e.deviceIn(inputs, nil, false)
	if err != nil {
		return nil, fmt.Errorf("forward %q: %w", e.uid, err)
	}
	return e.submitForward(ctx, in)
}

// BackwardDevice is ForwardDevice for a backward request.
func (e *Expert) BackwardDevice(ctx context.Context, inputs, gradOutputs []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	in, err := e.deviceIn(inputs, gradOutputs, true)
	if err != nil {
		return nil, fmt.Errorf("backward %q: %w", e.uid, err)
	}
	return e.submitBackward(ctx, in[:len(inputs):len(inputs)], in[len(inputs):])
}

// deviceIn admits copies of an in-process call's tensors, which must be
// tensors of the expert's device.
func (e *Expert) deviceIn(inputs, gradOutputs []*gpuhost.Tensor, backward bool) ([]*gpuhost.Tensor, error) {
	all := slices.Concat(inputs, gradOutputs)
	dev := e.Device()
	metas := make([]wire.Meta, len(all))
	var bytes int64
	for i, t := range all {
		if t == nil || t.Device() != dev {
			what := fmt.Sprintf("input %d", i)
			if i >= len(inputs) {
				what = fmt.Sprintf("output gradient %d", i-len(inputs))
			}
			return nil, fmt.Errorf("%w: %s is not a tensor of the server's device", ErrBadTensors, what)
		}
		metas[i] = wire.Meta{DType: t.DType(), Shape: wire.Dims64(t.Shape())}
		bytes += int64(t.ByteSize())
	}
	return e.admitTensors(metas[:len(inputs)], metas[len(inputs):], backward, bytes, func(i int) (*gpuhost.Tensor, error) {
		// Every tensor has a batch dimension (the schema checked it),
		// so a one-tensor Concat copies it.
		return dev.Concat([]*gpuhost.Tensor{all[i]})
	})
}
