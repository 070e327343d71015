package wire_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/sdk/wire"
)

// decoded is a wire tensor the ingress accepted: its dtype, its shape as
// Dims returned it, and its bytes.
type decoded struct {
	DType abi.DType
	Shape []int
	Data  []byte
}

// decode checks one wire tensor as the server's ingress does, alone:
// FitOne against its spec, then Dims.
func decode(pb *moehostv1.Tensor, schema *moehostv1.TensorSchema, batch int) (decoded, error) {
	r := wire.RawOf(pb)
	if err := wire.FitOne(schema, r.Meta(), batch); err != nil {
		return decoded{}, err
	}
	shape, err := r.Dims(schema)
	if err != nil {
		return decoded{}, err
	}
	return decoded{DType: r.DType, Shape: shape, Data: r.Data}, nil
}

var schema = &moehostv1.TensorSchema{Name: "x", Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{-1, 3}}

func TestFitOneThenDims(t *testing.T) {
	t.Parallel()
	f32 := moehostv1.DType_DTYPE_FLOAT32
	tests := []struct {
		name  string
		in    *moehostv1.Tensor
		batch int
		err   string // "" for success
	}{
		{"ok", &moehostv1.Tensor{Dtype: f32, Shape: []int64{2, 3}, Data: make([]byte, 24)}, -1, ""},
		{"ok batch", &moehostv1.Tensor{Dtype: f32, Shape: []int64{2, 3}, Data: make([]byte, 24)}, 2, ""},
		{"other batch", &moehostv1.Tensor{Dtype: f32, Shape: []int64{2, 3}, Data: make([]byte, 24)}, 3, "batch size 2, want x:float32[-1,3] with batch 3"},
		{"dtype", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_INT64, Shape: []int64{2, 3}, Data: make([]byte, 48)}, -1, "dtype int64"},
		{"unknown dtype", &moehostv1.Tensor{Dtype: 99, Shape: []int64{2, 3}, Data: make([]byte, 24)}, -1, "dtype invalid"},
		{"rank", &moehostv1.Tensor{Dtype: f32, Shape: []int64{6}, Data: make([]byte, 24)}, -1, "rank 1"},
		{"dim", &moehostv1.Tensor{Dtype: f32, Shape: []int64{3, 2}, Data: make([]byte, 24)}, -1, "shape [3 2]"},
		{"zero batch", &moehostv1.Tensor{Dtype: f32, Shape: []int64{0, 3}}, -1, "at least one example"},
		{"short", &moehostv1.Tensor{Dtype: f32, Shape: []int64{2, 3}, Data: make([]byte, 23)}, -1, "23 data bytes"},
		{"overflow", &moehostv1.Tensor{Dtype: f32, Shape: []int64{1 << 62, 3}}, -1, "too large"},
		{"float16 for float32", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT16, Shape: []int64{2, 3}, Data: make([]byte, 12)}, -1, ""},
		{"bfloat16 for float32", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_BFLOAT16, Shape: []int64{2, 3}, Data: make([]byte, 12)}, 2, ""},
		{"float16 with float32 bytes", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT16, Shape: []int64{2, 3}, Data: make([]byte, 24)}, -1, "want 12 bytes"},
		{"float16 for int32", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_FLOAT16, Shape: []int64{2}, Data: make([]byte, 4)}, -1, "dtype float16"},
		{"int64", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_INT64, Shape: []int64{2, 3}, Data: make([]byte, 48)}, -1, ""},
		{"int64 with float32 bytes", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_INT64, Shape: []int64{2, 3}, Data: make([]byte, 24)}, -1, "24 data bytes for shape [2 3] of int64, want 48 bytes (mask:int64[-1,3])"},
		{"float32 for int64", &moehostv1.Tensor{Dtype: f32, Shape: []int64{2, 3}, Data: make([]byte, 24)}, -1, "dtype float32, want mask:int64[-1,3]"},
		{"bool", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_BOOL, Shape: []int64{2, 3}, Data: []byte{0, 1, 1, 0, 0, 1}}, -1, ""},
		{"bool of 2", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_BOOL, Shape: []int64{2, 3}, Data: []byte{0, 1, 1, 0, 2, 1}}, -1, "bool element 4 is 2, want 0 or 1 (pad:bool[-1,3])"},
		{"bool short", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_BOOL, Shape: []int64{2, 3}, Data: []byte{0, 1}}, -1, "2 data bytes for shape [2 3] of bool, want 6 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sch := schema
			switch {
			case tt.name == "float16 for int32":
				sch = &moehostv1.TensorSchema{Name: "ids", Dtype: moehostv1.DType_DTYPE_INT32, Shape: []int64{-1}}
			case strings.Contains(tt.name, "int64"):
				sch = &moehostv1.TensorSchema{Name: "mask", Dtype: moehostv1.DType_DTYPE_INT64, Shape: []int64{-1, 3}}
			case strings.HasPrefix(tt.name, "bool"):
				sch = &moehostv1.TensorSchema{Name: "pad", Dtype: moehostv1.DType_DTYPE_BOOL, Shape: []int64{-1, 3}}
			}
			w, err := decode(tt.in, sch, tt.batch)
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if w.Shape[0] != 2 || len(w.Data) != 2*3*int(w.DType.Size()) || w.DType != abi.DType(tt.in.GetDtype()) {
					t.Fatalf("decoded %v with %d bytes", w.Shape, len(w.Data))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("error %v, want one containing %q", err, tt.err)
			}
		})
	}
}

// FuzzFitOneThenDims feeds arbitrary wire bytes to the tensor decoder the
// server's ingress runs (FitOne, then Dims): it
// must never panic, and whatever it accepts must be consistent.
func FuzzFitOneThenDims(f *testing.F) {
	for _, seed := range []*moehostv1.Tensor{
		{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{2, 3}, Data: make([]byte, 24)},
		{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{1 << 40, 3}},
		{Dtype: moehostv1.DType_DTYPE_INT32, Shape: []int64{-1, 3}, Data: []byte{1}},
		{Dtype: moehostv1.DType_DTYPE_FLOAT16, Shape: []int64{2, 3}, Data: make([]byte, 12)},
		{Dtype: moehostv1.DType_DTYPE_BFLOAT16, Shape: []int64{1, 3}, Data: make([]byte, 6)},
	} {
		b, err := proto.Marshal(seed)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, int64(-1))
	}
	f.Fuzz(func(t *testing.T, b []byte, batch int64) {
		var pb moehostv1.Tensor
		if proto.Unmarshal(b, &pb) != nil {
			return
		}
		if batch > 1<<20 || batch < -1 {
			batch = -1
		}
		w, err := decode(&pb, schema, int(batch))
		if err != nil {
			return
		}
		if len(w.Shape) != 2 || w.Shape[0] <= 0 || w.Shape[1] != 3 || len(w.Data) != w.Shape[0]*3*w.DType.Size() || w.DType.Size() == 0 {
			t.Fatalf("accepted an inconsistent tensor: shape %v, %d bytes", w.Shape, len(w.Data))
		}
		if batch >= 0 && w.Shape[0] != int(batch) {
			t.Fatalf("accepted batch %d, want %d", w.Shape[0], batch)
		}
		if w.DType != abi.DTypeFloat32 && !half.Is(w.DType) {
			t.Fatalf("accepted dtype %v for a float32 schema", w.DType)
		}
		// What the server does next with a half tensor: widen it.
		if half.Is(w.DType) {
			if err := half.Decode(w.DType, make([]float32, len(w.Data)/2), w.Data); err != nil {
				t.Fatalf("accepted a tensor the widening refuses: %v", err)
			}
		}
	})
}
