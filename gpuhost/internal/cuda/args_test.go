//go:build cuda || cudaemu

package cuda

import (
	"math"
	"slices"
	"strings"
	"testing"
)

// TestKernelArgs checks the real backend's argument slots: each value in
// the low bytes of its own 8-byte slot, little-endian, as cuLaunchKernel
// reads a parameter of its own size from it.
func TestKernelArgs(t *testing.T) {
	got, err := kernelArgs("k", []any{Ptr(0xdeadbeef00), int32(-1), int64(-2), uint32(7), float32(1.5), float64(-0.25)})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{0xdeadbeef00, 0xffffffff, 0xfffffffffffffffe, 7, uint64(math.Float32bits(1.5)), math.Float64bits(-0.25)}
	if !slices.Equal(got, want) {
		t.Errorf("slots %#x, want %#x", got, want)
	}
	for _, bad := range []any{3, uint64(1), "x", nil} {
		if _, err := kernelArgs("moe_k", []any{Ptr(1), bad}); err == nil || !strings.Contains(err.Error(), "moe_k: argument 1") {
			t.Errorf("argument %T: %v, want an error naming the kernel and argument 1", bad, err)
		}
	}
}
