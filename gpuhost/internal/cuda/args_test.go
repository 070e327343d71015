//go:build cuda || cudaemu

package cuda

import (
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestKernelArgs checks the real backend's argument slots: each value in
// the low bytes of its own 8-byte slot, little-endian, as cuLaunchKernel
// reads a parameter of its own size from it.
func TestKernelArgs(t *testing.T) {
	got, sig, err := kernelArgs("k", []any{Ptr(0xdeadbeef00), int32(-1), int64(-2), uint32(7), float32(1.5), float64(-0.25)})
	if err != nil {
		t.Fatal(err)
	}
	if string(sig) != "pilufd" {
		t.Errorf("sig %q, want pilufd", sig)
	}
	want := []uint64{0xdeadbeef00, 0xffffffff, 0xfffffffffffffffe, 7, uint64(math.Float32bits(1.5)), math.Float64bits(-0.25)}
	if !slices.Equal(got, want) {
		t.Errorf("slots %#x, want %#x", got, want)
	}
	for _, bad := range []any{3, uint64(1), "x", nil} {
		if _, _, err := kernelArgs("moe_k", []any{Ptr(1), bad}); err == nil || !strings.Contains(err.Error(), "moe_k: argument 1") {
			t.Errorf("argument %T: %v, want an error naming the kernel and argument 1", bad, err)
		}
	}
}

// TestPTXParams reads the committed PTX's kernel signatures, which the
// real backend checks every launch against, and checks the check.
func TestPTXParams(t *testing.T) {
	b, err := os.ReadFile("kernels/moehost.ptx")
	if err != nil {
		t.Fatal(err)
	}
	kernels := ptxParams(string(b))
	if n := strings.Count(string(b), ".entry "); len(kernels) != n || n < 30 {
		t.Fatalf("parsed %d kernels of the PTX's %d entries", len(kernels), n)
	}
	fill := kernels["moe_fill_f32"]
	if want := []string{".u64", ".f32", ".u64"}; !slices.Equal(fill, want) {
		t.Fatalf("moe_fill_f32's parameters %q, want %q", fill, want)
	}
	for name, params := range kernels {
		if len(params) == 0 || strings.Count(string(b), " "+name+"_param_") != len(params) {
			t.Errorf("%s: parsed %d parameters", name, len(params))
		}
	}
	if err := checkParams("moe_fill_f32", fill, []any{Ptr(1), float32(2), int64(3)}); err != nil {
		t.Errorf("the right arguments: %v", err)
	}
	for _, tt := range []struct {
		args []any
		msg  string
	}{
		{[]any{Ptr(1), float32(2)}, "2 arguments for 3 parameters"},
		{[]any{Ptr(1), float32(2), int32(3)}, "argument 2 is a int32, but the parameter is .u64"},
		{[]any{Ptr(1), float64(2), int64(3)}, "argument 1 is a float64, but the parameter is .f32"},
		{[]any{float32(1), float32(2), int64(3)}, "argument 0 is a float32"},
	} {
		if err := checkParams("moe_fill_f32", fill, tt.args); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%v: %v, want an error with %q", tt.args, err, tt.msg)
		}
	}
}
