package gpuhost_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// TestApplyStopsBetweenChunks cancels long ops a few milliseconds after
// they start: each gives up with the context's error instead of running
// to the end (seconds under -race), and a done context runs nothing.
func TestApplyStopsBetweenChunks(t *testing.T) {
	dev := gpuhost.NewCPU(2)
	zeros := func(shape ...int) *gpuhost.Tensor {
		x, err := dev.Zeros(abi.DTypeFloat32, shape)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	tests := []struct {
		name  string
		op    abi.Op
		args  []*gpuhost.Tensor
		attrs []float64
	}{
		{"matmul", abi.OpMatMul, []*gpuhost.Tensor{zeros(2048, 2048), zeros(2048, 2048)}, nil},
		{"matmul transposed", abi.OpMatMul, []*gpuhost.Tensor{zeros(2048, 2048), zeros(2048, 2048)}, []float64{1, 1}},
		{"linear", abi.OpLinear, []*gpuhost.Tensor{zeros(2048, 2048), zeros(2048, 2048)}, nil},
		{"batch matmul", abi.OpBatchMatMul, []*gpuhost.Tensor{zeros(16, 1024, 1024), zeros(16, 1024, 1024)}, nil},
		{"attention", abi.OpAttention, []*gpuhost.Tensor{zeros(2, 8, 1024, 256), zeros(2, 8, 1024, 256), zeros(2, 8, 1024, 256)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			timer := time.AfterFunc(5*time.Millisecond, cancel)
			defer timer.Stop()
			begin := time.Now()
			_, err := gpuhost.ApplyMultiContext(ctx, dev, nil, tt.op, tt.args, tt.attrs)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled %s: %v, want context.Canceled", tt.op, err)
			}
			t.Logf("%s returned %v after it started", tt.op, time.Since(begin))
			if _, err := gpuhost.ApplyMultiContext(ctx, dev, nil, tt.op, tt.args, tt.attrs); !errors.Is(err, context.Canceled) {
				t.Errorf("%s on a done context: %v, want context.Canceled", tt.op, err)
			}
		})
	}
}
