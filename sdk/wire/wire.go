// Package wire is the one codec between float32 values and the data of
// moehost.v1.Tensor: little-endian, row-major, as float32, or narrowed to
// float16 or bfloat16 on the wire. The server (host/internal/rpc), the Go
// client (sdk/client) and the load generator all use it, so that a change
// of the wire format is made once.
//
// It also holds the one check of a request's tensors against an expert's
// declared schema ([Fit]), in the schema's own vocabulary
// (moehost.v1.TensorSchema, which Info publishes): the server runs it
// once per request on every path, Connect, hivemind and in-process. And
// the one wire-level check of a DeployExpertRequest
// ([DeploymentFromProto]), with [Access], which the server and the CLI
// share: its refusals are plain errors wrapping [ErrInvalidRequest], which
// the server codes InvalidArgument.
package wire

import (
	"fmt"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/internal/lefloat"
)

// Encode returns values as the data of a tensor of dt: float16 and
// bfloat16 narrow them (round to nearest even), any other dt sends them
// as float32.
func Encode(dt abi.DType, values []float32) []byte {
	if half.Is(dt) {
		data := make([]byte, 2*len(values))
		_ = half.Encode(dt, data, values) // cannot fail: the sizes match
		return data
	}
	data := make([]byte, 4*len(values))
	lefloat.Put(data, values)
	return data
}

// Decode returns the values of data, a tensor of dt (float32, float16 or
// bfloat16), widened to float32. It fails for another dt, or data whose
// length is not a whole number of values.
func Decode(dt abi.DType, data []byte) ([]float32, error) {
	switch {
	case half.Is(dt):
		if len(data)%2 != 0 {
			return nil, fmt.Errorf("%d bytes of %v: not whole values", len(data), dt)
		}
		out := make([]float32, len(data)/2)
		if err := half.Decode(dt, out, data); err != nil {
			return nil, err
		}
		return out, nil
	case dt == abi.DTypeFloat32:
		if len(data)%4 != 0 {
			return nil, fmt.Errorf("%d bytes of %v: not whole values", len(data), dt)
		}
		out := make([]float32, len(data)/4)
		lefloat.Get(out, data)
		return out, nil
	}
	return nil, fmt.Errorf("dtype %v is not float32, float16 or bfloat16", dt)
}

// Tensor returns a wire tensor of values with shape, sent as dt (see
// Encode).
func Tensor(shape []int64, values []float32, dt abi.DType) *moehostv1.Tensor {
	if !half.Is(dt) {
		dt = abi.DTypeFloat32
	}
	return &moehostv1.Tensor{Dtype: moehostv1.DType(dt), Shape: shape, Data: Encode(dt, values)}
}

// Values returns the values of a float32, float16 or bfloat16 wire
// tensor, widened to float32.
func Values(t *moehostv1.Tensor) ([]float32, error) {
	return Decode(abi.DType(t.GetDtype()), t.GetData())
}
