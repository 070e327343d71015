package gpuhost_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// TestKernelsStopWithinAStep runs each long kernel family once to the end
// to learn how long it takes here (T), then again with its context
// cancelled at T/10: it must give up before T/2. A kernel that looks for
// the stop only between coarse pieces (attention's softmax over a wide
// head, before every row was checked) or never (elementwise kernels, the
// tape's backward) runs to about T and fails. The bound is a ratio of
// times measured in the same run, so a loaded machine slows both sides.
func TestKernelsStopWithinAStep(t *testing.T) {
	const minTimed = 50 * time.Millisecond
	if testing.Short() {
		t.Skip("runs each kernel to the end once")
	}
	dev := gpuhost.NewCPU(2)
	ones := func(shape ...int) *gpuhost.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(i%7) / 7
		}
		x, err := dev.FromFloat32(shape, data)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	const elems = 1 << 22
	big, big2 := ones(elems), ones(elems)
	rows := ones(1024, 4096)
	w, b := ones(4096), ones(4096)
	// One wide head: 3072×3072 scores from d=1, so the two GEMMs are
	// cheap and the softmax over the rows is nearly all the work.
	q, k, v := ones(1, 1, 3072, 1), ones(1, 1, 3072, 1), ones(1, 1, 3072, 1)
	long := ones(1, 2*elems) // one row: a softmax that is all one chunk

	// forward runs op; backward records op on a tape and runs the
	// tape's backward with respect to its args.
	type run func(ctx context.Context) error
	forward := func(op abi.Op, args ...*gpuhost.Tensor) run {
		return func(ctx context.Context) error {
			outs, err := gpuhost.ApplyMultiContext(ctx, dev, nil, op, args, nil)
			dev.Release(outs...)
			return err
		}
	}
	backward := func(op abi.Op, args ...*gpuhost.Tensor) run {
		tape := gpuhost.NewTape()
		outs, err := gpuhost.ApplyMulti(dev, tape, op, args, nil)
		if err != nil {
			t.Fatal(err)
		}
		gy := make([]*gpuhost.Tensor, len(outs))
		for i, o := range outs {
			gy[i] = ones(o.Shape()...)
		}
		t.Cleanup(func() { tape.Release(dev) })
		return func(ctx context.Context) error {
			gs, err := tape.BackwardContext(ctx, dev, outs, gy, args)
			dev.Release(gs...)
			return err
		}
	}
	tests := []struct {
		name string
		run  run
	}{
		{"gelu", forward(abi.OpGelu, big)},
		{"add", forward(abi.OpAdd, big, big2)},
		{"exp", forward(abi.OpExp, big)},
		{"softmax", forward(abi.OpSoftmax, rows)},
		{"softmax one long row", forward(abi.OpSoftmax, long)},
		{"sum one long row", forward(abi.OpSum, long)},
		{"layer_norm", forward(abi.OpLayerNorm, rows, w, b)},
		{"attention wide head", forward(abi.OpAttention, q, k, v)},
		{"gelu backward", backward(abi.OpGelu, big)},
		{"mul backward", backward(abi.OpMul, big, big2)},
		{"layer_norm backward", backward(abi.OpLayerNorm, rows, w, b)},
		{"attention backward", backward(abi.OpAttention, q, k, v)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A kernel that does not look for its stop fails every
			// attempt; one that does can still lose one to a busy
			// machine's scheduler, so it gets three.
			var late []string
			// A first run pays for fresh memory; time only warm ones.
			if err := tt.run(context.Background()); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				begin := time.Now()
				if err := tt.run(context.Background()); err != nil {
					t.Fatal(err)
				}
				full := time.Since(begin)
				if full < minTimed {
					// Without -race some ops finish in a few ms, where a
					// pause of the scheduler or the collector is as long
					// as the op and T/10 says nothing.
					t.Skipf("runs %v here, too quick to time a stop against (under %v)", full, minTimed)
				}
				ctx, cancel := context.WithCancel(context.Background())
				timer := time.AfterFunc(full/10, cancel)
				begin = time.Now()
				err := tt.run(ctx)
				took := time.Since(begin)
				timer.Stop()
				cancel()
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("cancelled at %v of %v: %v, want context.Canceled", full/10, full, err)
				}
				t.Logf("runs %v; cancelled at %v, returned after %v", full, full/10, took)
				if took <= full/2 {
					return
				}
				late = append(late, fmt.Sprintf("cancelled at %v of %v, returned after %v", full/10, full, took))
			}
			t.Errorf("the kernel ran on for most of its time in every attempt: %s", strings.Join(late, "; "))
		})
	}
}
