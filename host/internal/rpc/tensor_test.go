package rpc_test

import (
	"strings"
	"testing"

	"github.com/moehost/moehost/abi"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/host/internal/rpc"
)

// TestRawAllMissing: a request whose tensor list holds no tensor (an
// in-process caller can build one; the wire cannot) is refused naming it.
func TestRawAllMissing(t *testing.T) {
	t.Parallel()
	f32 := moehostv1.DType_DTYPE_FLOAT32
	_, err := rpc.RawAll([]*moehostv1.Tensor{{Dtype: f32, Shape: []int64{1, 3}, Data: make([]byte, 12)}, nil}, "input")
	if err == nil || !strings.Contains(err.Error(), "input 1: tensor is missing") {
		t.Fatalf("error %v, want one naming input 1 as missing", err)
	}
}

func TestCheckWireDType(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   moehostv1.DType
		want abi.DType
		ok   bool
	}{
		{moehostv1.DType_DTYPE_UNSPECIFIED, abi.DTypeFloat32, true},
		{moehostv1.DType_DTYPE_FLOAT32, abi.DTypeFloat32, true},
		{moehostv1.DType_DTYPE_FLOAT16, abi.DTypeFloat16, true},
		{moehostv1.DType_DTYPE_BFLOAT16, abi.DTypeBFloat16, true},
		{moehostv1.DType_DTYPE_INT32, 0, false},
		{99, 0, false},
	} {
		got, err := rpc.CheckWireDType(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("CheckWireDType(%v) = %v, %v; want %v, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
