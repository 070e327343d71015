package wire

import (
	"fmt"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
)

// Raw is a tensor as a wire carries it, once its framing is parsed: its
// dtype as sent (float16 or bfloat16 may stand for float32), its shape,
// whose first dimension is the batch, and its little-endian bytes. Nothing
// about it is checked yet: the server's one ingress checks it against the
// expert's schema (Fit), then its bytes against its shape (Dims).
type Raw struct {
	DType abi.DType
	Shape []int64
	Data  []byte
}

// RawOf is pb's raw tensor; it copies nothing.
func RawOf(pb *moehostv1.Tensor) Raw {
	return Raw{DType: abi.DType(pb.GetDtype()), Shape: pb.GetShape(), Data: pb.GetData()}
}

// Proto is r as a wire message; it copies nothing.
func (r Raw) Proto() *moehostv1.Tensor {
	return &moehostv1.Tensor{Dtype: moehostv1.DType(r.DType), Shape: r.Shape, Data: r.Data}
}

// Dims64 is a device tensor's shape as the wire writes it.
func Dims64(shape []int) []int64 {
	out := make([]int64, len(shape))
	for i, d := range shape {
		out[i] = int64(d)
	}
	return out
}

// Meta is what the schema check reads of r.
func (r Raw) Meta() Meta { return Meta{DType: r.DType, Shape: r.Shape} }

// maxElements bounds a decoded tensor; the message size limit bounds it
// first in practice.
const maxElements = 1 << 34

// Dims checks that r, which fits schema (Fit said so, and schema names it
// in messages), carries exactly the bytes its shape and dtype say, and
// that each byte of a bool is 0 or 1, and returns its shape as ints.
func (r Raw) Dims(schema *moehostv1.TensorSchema) ([]int, error) {
	shape := make([]int, len(r.Shape))
	n := int64(1)
	for i, d := range r.Shape {
		if d < 0 || d > maxElements/n {
			return nil, fmt.Errorf("shape %v is too large, want %s", r.Shape, SpecString(schema))
		}
		n *= max(d, 1)
		shape[i] = int(d)
	}
	if want := elements(r.Shape) * int64(r.DType.Size()); int64(len(r.Data)) != want {
		return nil, fmt.Errorf("%d data bytes for shape %v of %v, want %d bytes (%s)", len(r.Data), r.Shape, r.DType, want, SpecString(schema))
	}
	if r.DType == abi.DTypeBool {
		// One meaning per value: a device reads any nonzero byte as
		// true, and hivemind's torch.bool is 0 or 1.
		for i, b := range r.Data {
			if b > 1 {
				return nil, fmt.Errorf("bool element %d is %d, want 0 or 1 (%s)", i, b, SpecString(schema))
			}
		}
	}
	return shape, nil
}

// elements is the element count of a shape whose dims Dims bounded.
func elements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}
