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

// maxElements bounds a decoded tensor; the message size limit bounds it
// first in practice.
const maxElements = 1 << 34

// DecodeTensor validates a wire tensor against a schema: wire.FitOne's
// check (dtype, with float16 and bfloat16 standing in for float32; rank;
// every dim but the batch dim; a positive batch size, equal to batch when
// batch >= 0), then a data length that matches the shape exactly. It
// copies nothing.
func DecodeTensor(pb *moehostv1.Tensor, schema *moehostv1.TensorSchema, batch int) (WireTensor, error) {
	if pb == nil {
		return WireTensor{}, fmt.Errorf("tensor is missing, want %s", wire.SpecString(schema))
	}
	if err := wire.FitOne(schema, metaOf(pb), batch); err != nil {
		return WireTensor{}, err
	}
	return decodeFitted(pb, schema)
}

// metaOf is what the schema check reads of a wire tensor.
func metaOf(pb *moehostv1.Tensor) wire.Meta {
	return wire.Meta{DType: abi.DType(pb.GetDtype()), Shape: pb.GetShape()}
}

// decodeFitted checks the size and data of a wire tensor that fits
// schema (wire.Fit said so), which names it in messages.
func decodeFitted(pb *moehostv1.Tensor, schema *moehostv1.TensorSchema) (WireTensor, error) {
	dt, dims := abi.DType(pb.GetDtype()), pb.GetShape()
	shape := make([]int, len(dims))
	n := int64(1)
	for i, d := range dims {
		if d > maxElements/n {
			return WireTensor{}, fmt.Errorf("shape %v is too large, want %s", dims, wire.SpecString(schema))
		}
		n *= d
		shape[i] = int(d)
	}
	if int64(len(pb.GetData())) != n*int64(dt.Size()) {
		return WireTensor{}, fmt.Errorf("%d data bytes for shape %v of %v, want %d bytes (%s)", len(pb.GetData()), dims, dt, n*int64(dt.Size()), wire.SpecString(schema))
	}
	return WireTensor{DType: dt, Shape: shape, Data: pb.GetData()}, nil
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
