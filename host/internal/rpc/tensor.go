package rpc

import (
	"fmt"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/sdk/wire"
)

// WireTensor is a wire tensor after validation.
type WireTensor struct {
	// DType is the dtype on the wire: the schema's, or float16 or
	// bfloat16 where the schema says float32.
	DType abi.DType
	Shape []int // Shape[0] is the batch size
	Data  []byte
}

// DecodeTensor validates a wire tensor against a schema as the server's
// ingress does: wire.FitOne's check (dtype, with float16 and bfloat16
// standing in for float32; rank; every dim but the batch dim; a positive
// batch size, equal to batch when batch >= 0), then a data length that
// matches the shape exactly (wire.Raw.Dims). It copies nothing.
func DecodeTensor(pb *moehostv1.Tensor, schema *moehostv1.TensorSchema, batch int) (WireTensor, error) {
	if pb == nil {
		return WireTensor{}, fmt.Errorf("tensor is missing, want %s", wire.SpecString(schema))
	}
	r := wire.RawOf(pb)
	if err := wire.FitOne(schema, r.Meta(), batch); err != nil {
		return WireTensor{}, err
	}
	shape, err := r.Dims(schema)
	if err != nil {
		return WireTensor{}, err
	}
	return WireTensor{DType: r.DType, Shape: shape, Data: r.Data}, nil
}

// CheckWireDType validates the dtype a caller asks float32 results in:
// unspecified and float32 mean float32, and float16 and bfloat16 halve
// them. It returns the dtype to send.
func CheckWireDType(dt moehostv1.DType) (abi.DType, error) {
	switch d := abi.DType(dt); {
	case dt == moehostv1.DType_DTYPE_UNSPECIFIED || d == abi.DTypeFloat32:
		return abi.DTypeFloat32, nil
	case half.Is(d):
		return d, nil
	default:
		return 0, fmt.Errorf("dtype %v: float32 results can be sent as float32, float16 or bfloat16", d)
	}
}

// SpecString renders a schema as name:float32[-1,1024] (wire.SpecString).
func SpecString(s *moehostv1.TensorSchema) string { return wire.SpecString(s) }

// SchemaString renders a list of schemas (wire.SchemaString).
func SchemaString(ss []*moehostv1.TensorSchema) string { return wire.SchemaString(ss) }
