package wire

import (
	"fmt"
	"strings"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
)

// Meta is what a schema check reads of a tensor: its dtype as sent (on
// the wire, or on a device) and its shape.
type Meta struct {
	DType abi.DType
	Shape []int64
}

// Fit checks tensors against a schema (an expert's declared inputs or
// outputs): their number; each one's dtype (float16 and bfloat16 stand in
// for float32, which they are widened to), rank and every dimension but
// the first; and one positive batch size, the first dimension, across
// them, equal to batch when batch >= 0. what names the tensors in its
// messages ("input"). It returns the batch size.
//
// It is the one schema check of a request: the server runs it once per
// request, on the wire tensors before they are decoded (Connect, hivemind)
// or on a caller's device tensors (in-process calls), so that every path
// refuses the same tensors with the same message.
func Fit(schema []*moehostv1.TensorSchema, what string, ts []Meta, batch int) (int, error) {
	if len(ts) != len(schema) {
		return 0, fmt.Errorf("got %d %ss, want %d: %s", len(ts), what, len(schema), SchemaString(schema))
	}
	for i, t := range ts {
		if err := FitOne(schema[i], t, batch); err != nil {
			return 0, fmt.Errorf("%s %d: %w", what, i, err)
		}
		batch = int(t.Shape[0])
	}
	return batch, nil
}

// FitOne checks one tensor against its schema, as Fit does.
func FitOne(s *moehostv1.TensorSchema, t Meta, batch int) error {
	// The spec is rendered only for a refusal: every request runs this.
	want := func() string {
		w := SpecString(s)
		if batch >= 0 {
			w += fmt.Sprintf(" with batch %d", batch)
		}
		return w
	}
	if t.DType != abi.DType(s.GetDtype()) && !(half.Is(t.DType) && s.GetDtype() == moehostv1.DType_DTYPE_FLOAT32) {
		return fmt.Errorf("dtype %v, want %s", t.DType, want())
	}
	if len(t.Shape) != len(s.GetShape()) {
		return fmt.Errorf("rank %d (shape %v), want %s", len(t.Shape), t.Shape, want())
	}
	if len(t.Shape) == 0 {
		return fmt.Errorf("schema %s has rank 0", want())
	}
	if t.Shape[0] <= 0 {
		return fmt.Errorf("batch size %d (shape %v): a batch needs at least one example; want %s", t.Shape[0], t.Shape, want())
	}
	if batch >= 0 && t.Shape[0] != int64(batch) {
		return fmt.Errorf("batch size %d, want %s", t.Shape[0], want())
	}
	for i, d := range t.Shape[1:] {
		if d != s.GetShape()[i+1] {
			return fmt.Errorf("shape %v, want %s", t.Shape, want())
		}
	}
	return nil
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
