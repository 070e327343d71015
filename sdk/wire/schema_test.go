package wire_test

import (
	"strings"
	"testing"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/sdk/wire"
)

func TestFit(t *testing.T) {
	t.Parallel()
	schema := []*moehostv1.TensorSchema{
		{Name: "x", Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{-1, 4}},
		{Name: "mask", Dtype: moehostv1.DType_DTYPE_INT32, Shape: []int64{-1}},
	}
	f32 := func(shape ...int64) wire.Meta { return wire.Meta{DType: abi.DTypeFloat32, Shape: shape} }
	i32 := func(shape ...int64) wire.Meta { return wire.Meta{DType: abi.DTypeInt32, Shape: shape} }
	tests := []struct {
		name  string
		ts    []wire.Meta
		batch int
		want  int    // the batch size, when err is ""
		err   string // the whole message, or "" for a fit
	}{
		{"fits", []wire.Meta{f32(3, 4), i32(3)}, -1, 3, ""},
		{"fits the batch asked", []wire.Meta{f32(3, 4), i32(3)}, 3, 3, ""},
		{"float16 for float32", []wire.Meta{{DType: abi.DTypeFloat16, Shape: []int64{2, 4}}, i32(2)}, -1, 2, ""},
		{"bfloat16 for float32", []wire.Meta{{DType: abi.DTypeBFloat16, Shape: []int64{2, 4}}, i32(2)}, -1, 2, ""},
		{"count", []wire.Meta{f32(3, 4)}, -1, 0, "got 1 inputs, want 2: x:float32[-1,4], mask:int32[-1]"},
		{"float16 for int32", []wire.Meta{f32(2, 4), {DType: abi.DTypeFloat16, Shape: []int64{2}}}, -1, 0, "input 1: dtype float16, want mask:int32[-1] with batch 2"},
		{"rank", []wire.Meta{f32(4), i32(3)}, -1, 0, "input 0: rank 1 (shape [4]), want x:float32[-1,4]"},
		{"width", []wire.Meta{f32(3, 5), i32(3)}, -1, 0, "input 0: shape [3 5], want x:float32[-1,4]"},
		{"empty batch", []wire.Meta{f32(0, 4), i32(0)}, -1, 0, "input 0: batch size 0 (shape [0 4]): a batch needs at least one example; want x:float32[-1,4]"},
		{"two batch sizes", []wire.Meta{f32(3, 4), i32(2)}, -1, 0, "input 1: batch size 2, want mask:int32[-1] with batch 3"},
		{"not the batch asked", []wire.Meta{f32(3, 4), i32(3)}, 2, 0, "input 0: batch size 3, want x:float32[-1,4] with batch 2"},
	}
	for _, tt := range tests {
		got, err := wire.Fit(schema, "input", tt.ts, tt.batch)
		switch {
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("%s: Fit = %d, %v; want %d", tt.name, got, err, tt.want)
		case tt.err != "" && (err == nil || err.Error() != tt.err):
			t.Errorf("%s: Fit = %v; want %q", tt.name, err, tt.err)
		}
	}
	if s := wire.SchemaString(schema); !strings.Contains(s, "x:float32[-1,4]") {
		t.Errorf("SchemaString = %q", s)
	}
}

// TestFitAllocatesNothing: Fit runs on every request, so a fit must cost
// no allocation; the schema is rendered for refusals only.
func TestFitAllocatesNothing(t *testing.T) {
	schema := []*moehostv1.TensorSchema{
		{Name: "x", Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{-1, 1024}},
		{Name: "mask", Dtype: moehostv1.DType_DTYPE_INT32, Shape: []int64{-1}},
	}
	ts := []wire.Meta{{DType: abi.DTypeFloat32, Shape: []int64{1, 1024}}, {DType: abi.DTypeInt32, Shape: []int64{1}}}
	for _, batch := range []int{-1, 1} {
		if n := testing.AllocsPerRun(100, func() {
			if _, err := wire.Fit(schema, "input", ts, batch); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("batch %d: Fit allocated %v times for tensors that fit, want 0", batch, n)
		}
	}
}
