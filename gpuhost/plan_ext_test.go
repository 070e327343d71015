package gpuhost_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// TestPlanSizesWithoutAllocating checks that PlanOp sizes an op's results
// and internal tensors from shapes alone: a 4 TiB matmul result is sized
// without a byte of it allocated, and attention's probabilities count.
func TestPlanSizesWithoutAllocating(t *testing.T) {
	dev := gpuhost.NewCPU(1)
	f := func(shape ...int) *gpuhost.Tensor { return mustZeros(t, dev, abi.DTypeFloat32, shape...) }
	tests := []struct {
		name    string
		op      abi.Op
		args    []*gpuhost.Tensor
		attrs   []float64
		bytes   int64
		tensors int
	}{
		{name: "matmul 4 TiB", op: abi.OpMatMul, args: []*gpuhost.Tensor{f(1<<20, 1), f(1, 1<<20)}, bytes: 4 << 40, tensors: 1},
		{name: "attention probabilities", op: abi.OpAttention, args: []*gpuhost.Tensor{f(2, 3, 64, 8), f(2, 3, 128, 8), f(2, 3, 128, 5)},
			bytes: 4 * (2*3*64*5 + 2*3*64*128), tensors: 2},
		{name: "layer_norm statistics", op: abi.OpLayerNorm, args: []*gpuhost.Tensor{f(7, 16), f(16), f(16)}, bytes: 4 * (7*16 + 2*7), tensors: 3},
		{name: "max indices", op: abi.OpMax, args: []*gpuhost.Tensor{f(6, 10)}, attrs: []float64{1}, bytes: 4*6 + 4*6, tensors: 2},
		{name: "cross_entropy mean", op: abi.OpCrossEntropy, args: []*gpuhost.Tensor{f(9, 4), mustZeros(t, dev, abi.DTypeInt32, 9)}, attrs: []float64{1}, bytes: 4 + 2*4*9, tensors: 3},
		{name: "linear_gelu_tanh", op: abi.OpLinearGeluTanh, args: []*gpuhost.Tensor{f(5, 8), f(6, 8), f(6)}, bytes: 4 * 5 * 6, tensors: 1},
		{name: "add_layer_norm", op: abi.OpAddLayerNorm, args: []*gpuhost.Tensor{f(7, 16), f(16), f(16), f(16)}, bytes: 4 * (7*16 + 2*7), tensors: 3},
		{name: "split", op: abi.OpSplit, args: []*gpuhost.Tensor{f(4, 6)}, attrs: []float64{1, 2, 4}, bytes: 4 * 24, tensors: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			p, err := gpuhost.PlanOp(dev, tt.op, tt.args, tt.attrs)
			if err != nil {
				t.Fatal(err)
			}
			runtime.ReadMemStats(&after)
			if got := p.Bytes(); got != tt.bytes {
				t.Errorf("Bytes() = %d, want %d", got, tt.bytes)
			}
			if got := p.Tensors(); got != tt.tensors {
				t.Errorf("Tensors() = %d, want %d", got, tt.tensors)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
				t.Errorf("PlanOp allocated %d bytes", grew)
			}
			if p.BackwardBytes() < p.Bytes() {
				t.Errorf("BackwardBytes() = %d < Bytes() = %d", p.BackwardBytes(), p.Bytes())
			}
			if tt.bytes > 1<<30 {
				return
			}
			outs, err := p.Run(dev, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(outs) != p.Results() {
				t.Errorf("Run returned %d results, Results() = %d", len(outs), p.Results())
			}
			if _, err := p.Run(dev, nil); err == nil {
				t.Error("a plan ran twice")
			}
		})
	}
}

// TestFusedOpsStoreIntermediateForTapeOnly checks that the fused ops keep
// their intermediate (the pre-activation, the sum) only when recorded:
// without a tape, what a run allocates at its peak, and Bytes(), are
// exactly the result and the statistics; with one, the intermediate more,
// which BackwardBytes covers. Sizes are powers of two, so that the pool's size
// classes are exact.
func TestFusedOpsStoreIntermediateForTapeOnly(t *testing.T) {
	for _, tt := range []struct {
		name   string
		op     abi.Op
		shapes [][]int
		bytes  int64 // the result and the statistics
		extra  int64 // the intermediate
	}{
		{name: "linear_gelu_tanh", op: abi.OpLinearGeluTanh, shapes: [][]int{{64, 32}, {128, 32}, {128}}, bytes: 4 * 64 * 128, extra: 4 * 64 * 128},
		{name: "add_layer_norm", op: abi.OpAddLayerNorm, shapes: [][]int{{64, 256}, {64, 256}, {256}, {256}}, bytes: 4 * (64*256 + 2*64), extra: 4 * 64 * 256},
	} {
		for _, taped := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/taped=%t", tt.name, taped), func(t *testing.T) {
				dev := gpuhost.NewCPU(1)
				args := make([]*gpuhost.Tensor, len(tt.shapes))
				for i, s := range tt.shapes {
					args[i] = mustZeros(t, dev, abi.DTypeFloat32, s...)
				}
				p, err := gpuhost.PlanOp(dev, tt.op, args, nil)
				if err != nil {
					t.Fatal(err)
				}
				if p.Bytes() != tt.bytes {
					t.Errorf("Bytes() = %d, want %d", p.Bytes(), tt.bytes)
				}
				var tape *gpuhost.Tape
				want := tt.bytes
				if taped {
					tape = gpuhost.NewTape()
					want += tt.extra
				}
				before := dev.MemStats()
				if before.PeakBytes != before.LiveBytes {
					t.Fatalf("peak %d != live %d before the run", before.PeakBytes, before.LiveBytes)
				}
				if _, err := p.Run(dev, tape); err != nil {
					t.Fatal(err)
				}
				if got := dev.MemStats().PeakBytes - before.LiveBytes; got != want {
					t.Errorf("the run allocated %d bytes at its peak, want %d", got, want)
				}
				if taped && p.BackwardBytes() < tt.extra {
					t.Errorf("BackwardBytes() = %d does not cover the kept %d bytes", p.BackwardBytes(), tt.extra)
				}
			})
		}
	}
}
