package rpc_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/host/rpc"
)

var schema = &moehostv1.TensorSchema{Name: "x", Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{-1, 3}}

func TestDecodeTensor(t *testing.T) {
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
		{"nil", nil, -1, "missing"},
		{"dtype", &moehostv1.Tensor{Dtype: moehostv1.DType_DTYPE_INT64, Shape: []int64{2, 3}, Data: make([]byte, 48)}, -1, "dtype int64"},
		{"unknown dtype", &moehostv1.Tensor{Dtype: 99, Shape: []int64{2, 3}, Data: make([]byte, 24)}, -1, "dtype invalid"},
		{"rank", &moehostv1.Tensor{Dtype: f32, Shape: []int64{6}, Data: make([]byte, 24)}, -1, "rank 1"},
		{"dim", &moehostv1.Tensor{Dtype: f32, Shape: []int64{3, 2}, Data: make([]byte, 24)}, -1, "shape [3 2]"},
		{"zero batch", &moehostv1.Tensor{Dtype: f32, Shape: []int64{0, 3}}, -1, "at least one example"},
		{"short", &moehostv1.Tensor{Dtype: f32, Shape: []int64{2, 3}, Data: make([]byte, 23)}, -1, "23 data bytes"},
		{"overflow", &moehostv1.Tensor{Dtype: f32, Shape: []int64{1 << 62, 3}}, -1, "too large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w, err := rpc.DecodeTensor(tt.in, schema, tt.batch)
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if w.Shape[0] != 2 || len(w.Data) != 24 {
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

// FuzzDecodeTensor feeds arbitrary wire bytes to the tensor decoder: it
// must never panic, and whatever it accepts must be consistent.
func FuzzDecodeTensor(f *testing.F) {
	for _, seed := range []*moehostv1.Tensor{
		{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{2, 3}, Data: make([]byte, 24)},
		{Dtype: moehostv1.DType_DTYPE_FLOAT32, Shape: []int64{1 << 40, 3}},
		{Dtype: moehostv1.DType_DTYPE_INT32, Shape: []int64{-1, 3}, Data: []byte{1}},
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
		w, err := rpc.DecodeTensor(&pb, schema, int(batch))
		if err != nil {
			return
		}
		if len(w.Shape) != 2 || w.Shape[0] <= 0 || w.Shape[1] != 3 || len(w.Data) != w.Shape[0]*3*4 {
			t.Fatalf("accepted an inconsistent tensor: shape %v, %d bytes", w.Shape, len(w.Data))
		}
		if batch >= 0 && w.Shape[0] != int(batch) {
			t.Fatalf("accepted batch %d, want %d", w.Shape[0], batch)
		}
	})
}
