package rpc

import (
	"errors"
	"fmt"
	"strings"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
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

// DecodeTensor validates a wire tensor against a schema: dtype (float16
// and bfloat16 stand in for float32), rank, every dim but the batch dim, a
// positive batch size (equal to batch when batch >= 0), and a data length
// that matches the shape exactly. It copies nothing.
func DecodeTensor(pb *moehostv1.Tensor, schema *moehostv1.TensorSchema, batch int) (WireTensor, error) {
	want := SpecString(schema)
	if batch >= 0 {
		want += fmt.Sprintf(" with batch %d", batch)
	}
	if pb == nil {
		return WireTensor{}, fmt.Errorf("tensor is missing, want %s", want)
	}
	dt := abi.DType(pb.GetDtype())
	if dt != abi.DType(schema.GetDtype()) && !(half.Is(dt) && schema.GetDtype() == moehostv1.DType_DTYPE_FLOAT32) {
		return WireTensor{}, fmt.Errorf("dtype %v, want %s", dt, want)
	}
	dims := pb.GetShape()
	if len(dims) != len(schema.GetShape()) {
		return WireTensor{}, fmt.Errorf("rank %d (shape %v), want %s", len(dims), dims, want)
	}
	if len(dims) == 0 {
		return WireTensor{}, errors.New("schema has rank 0")
	}
	if dims[0] <= 0 {
		return WireTensor{}, fmt.Errorf("batch size %d (shape %v): a batch needs at least one example; want %s", dims[0], dims, want)
	}
	if batch >= 0 && dims[0] != int64(batch) {
		return WireTensor{}, fmt.Errorf("batch size %d, want %s", dims[0], want)
	}
	shape := make([]int, len(dims))
	n := int64(1)
	for i, d := range dims {
		if i > 0 && d != schema.GetShape()[i] {
			return WireTensor{}, fmt.Errorf("shape %v, want %s", dims, want)
		}
		if d > maxElements/n {
			return WireTensor{}, fmt.Errorf("shape %v is too large, want %s", dims, want)
		}
		n *= d
		shape[i] = int(d)
	}
	if int64(len(pb.GetData())) != n*int64(dt.Size()) {
		return WireTensor{}, fmt.Errorf("%d data bytes for shape %v of %v, want %d bytes (%s)", len(pb.GetData()), dims, dt, n*int64(dt.Size()), want)
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

// SpecString renders a schema as name:float32[-1,1024].
func SpecString(s *moehostv1.TensorSchema) string {
	dims := make([]string, len(s.GetShape()))
	for i, d := range s.GetShape() {
		dims[i] = fmt.Sprint(d)
	}
	return fmt.Sprintf("%s:%v[%s]", s.GetName(), abi.DType(s.GetDtype()), strings.Join(dims, ","))
}

// SchemaString renders a list of schemas.
func SchemaString(ss []*moehostv1.TensorSchema) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = SpecString(s)
	}
	return strings.Join(parts, ", ")
}
