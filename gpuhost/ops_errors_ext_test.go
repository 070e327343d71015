package gpuhost_test

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// TestOpErrors checks that the ops of codes 6–36 refuse what they must,
// with the documented sentinel and a message that names the problem.
func TestOpErrors(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(1)
	f := func(shape ...int) *gpuhost.Tensor { return mustZeros(t, dev, abi.DTypeFloat32, shape...) }
	ints := func(dt abi.DType, v ...int64) *gpuhost.Tensor {
		b := make([]byte, len(v)*dt.Size())
		for i, e := range v {
			if dt == abi.DTypeInt32 {
				binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(e)))
			} else {
				binary.LittleEndian.PutUint64(b[8*i:], uint64(e))
			}
		}
		x, err := dev.FromBytes(dt, []int{len(v)}, b)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	mask, err := dev.Zeros(abi.DTypeBool, []int{2, 5})
	if err != nil {
		t.Fatal(err)
	}
	q, k, v := f(2, 2, 3, 4), f(2, 2, 5, 4), f(2, 2, 5, 3)
	type T = []*gpuhost.Tensor
	nan := math.NaN()
	tests := []struct {
		name    string
		op      abi.Op
		args    []*gpuhost.Tensor
		attrs   []float64
		wantErr error
		wantMsg string // a substring of the message
	}{
		{name: "sub-no-suffix", op: abi.OpSub, args: T{f(2, 3), f(2)}, wantErr: gpuhost.ErrShape, wantMsg: "sub: [2 3] and [2]"},
		{name: "div-one-arg", op: abi.OpDiv, args: T{f(2)}, wantErr: gpuhost.ErrArgument},
		{name: "mul-int", op: abi.OpMul, args: T{f(2), ints(abi.DTypeInt32, 1, 2)}, wantErr: gpuhost.ErrArgument, wantMsg: "want float32"},
		{name: "scale-nan", op: abi.OpScale, args: T{f(2)}, attrs: []float64{nan}, wantErr: gpuhost.ErrArgument},
		{name: "add_scalar-inf", op: abi.OpAddScalar, args: T{f(2)}, attrs: []float64{math.Inf(1)}, wantErr: gpuhost.ErrArgument},
		{name: "relu-attr", op: abi.OpRelu, args: T{f(2)}, attrs: []float64{1}, wantErr: gpuhost.ErrArgument},
		{name: "softmax-axis-range", op: abi.OpSoftmax, args: T{f(2, 3)}, attrs: []float64{2}, wantErr: gpuhost.ErrArgument, wantMsg: "axis 2 is outside [-2, 1]"},
		{name: "softmax-axis-fraction", op: abi.OpSoftmax, args: T{f(2, 3)}, attrs: []float64{0.5}, wantErr: gpuhost.ErrArgument, wantMsg: "not an integer"},
		{name: "log_softmax-scalar", op: abi.OpLogSoftmax, args: T{f()}, wantErr: gpuhost.ErrShape},
		{name: "rms_norm-w", op: abi.OpRMSNorm, args: T{f(2, 3), f(4)}, wantErr: gpuhost.ErrShape},
		{name: "rms_norm-eps", op: abi.OpRMSNorm, args: T{f(2, 3), f(3)}, attrs: []float64{-1}, wantErr: gpuhost.ErrArgument},
		{name: "reshape-count", op: abi.OpReshape, args: T{f(2, 3)}, attrs: []float64{4, 2}, wantErr: gpuhost.ErrShape},
		{name: "reshape-two-infer", op: abi.OpReshape, args: T{f(2, 3)}, attrs: []float64{-1, -1}, wantErr: gpuhost.ErrArgument},
		{name: "reshape-infer-indivisible", op: abi.OpReshape, args: T{f(2, 3)}, attrs: []float64{4, -1}, wantErr: gpuhost.ErrShape},
		{name: "reshape-huge", op: abi.OpReshape, args: T{f(2, 3)}, attrs: []float64{1e18, 1e18}, wantErr: gpuhost.ErrArgument},
		{name: "reshape-overflow", op: abi.OpReshape, args: T{f(2, 3)}, attrs: []float64{1 << 30, 1 << 30, 1 << 30}, wantErr: gpuhost.ErrShape},
		{name: "reshape-zero", op: abi.OpReshape, args: T{f(2, 3)}, attrs: []float64{0, 6}, wantErr: gpuhost.ErrArgument},
		{name: "permute-repeat", op: abi.OpPermute, args: T{f(2, 3)}, attrs: []float64{0, 0}, wantErr: gpuhost.ErrArgument, wantMsg: "not a permutation"},
		{name: "permute-count", op: abi.OpPermute, args: T{f(2, 3)}, attrs: []float64{0}, wantErr: gpuhost.ErrArgument},
		{name: "transpose-one-attr", op: abi.OpTranspose, args: T{f(2, 3)}, attrs: []float64{0}, wantErr: gpuhost.ErrArgument},
		{name: "concat-dims", op: abi.OpConcat, args: T{f(2, 3), f(3, 2)}, wantErr: gpuhost.ErrShape, wantMsg: "concat: arg 1 is [3 2]"},
		{name: "concat-rank", op: abi.OpConcat, args: T{f(2, 3), f(2, 3, 1)}, wantErr: gpuhost.ErrShape},
		{name: "slice-end-past", op: abi.OpSlice, args: T{f(4, 3)}, attrs: []float64{0, 1, 5}, wantErr: gpuhost.ErrArgument, wantMsg: "end 5 is outside [2, 4]"},
		{name: "slice-empty", op: abi.OpSlice, args: T{f(4, 3)}, attrs: []float64{0, 2, 2}, wantErr: gpuhost.ErrArgument},
		{name: "slice-negative-start", op: abi.OpSlice, args: T{f(4, 3)}, attrs: []float64{0, -1, 2}, wantErr: gpuhost.ErrArgument},
		{name: "slice-two-attrs", op: abi.OpSlice, args: T{f(4, 3)}, attrs: []float64{0, 1}, wantErr: gpuhost.ErrArgument},
		{name: "split-apply", op: abi.OpSplit, args: T{f(4, 3)}, attrs: []float64{0, 2, 2}, wantErr: gpuhost.ErrArgument, wantMsg: "ApplyMulti"},
		{name: "sum-keepdim", op: abi.OpSum, args: T{f(4, 3)}, attrs: []float64{0, 2}, wantErr: gpuhost.ErrArgument},
		{name: "mean-nan-axis", op: abi.OpMean, args: T{f(4, 3)}, attrs: []float64{nan}, wantErr: gpuhost.ErrArgument},
		{name: "max-scalar", op: abi.OpMax, args: T{f()}, wantErr: gpuhost.ErrShape},
		{name: "dropout-keep-zero", op: abi.OpDropout, args: T{f(2, 3), f(2, 3)}, attrs: []float64{0}, wantErr: gpuhost.ErrArgument},
		{name: "dropout-keep-big", op: abi.OpDropout, args: T{f(2, 3), f(2, 3)}, attrs: []float64{1.5}, wantErr: gpuhost.ErrArgument},
		{name: "dropout-mask-larger", op: abi.OpDropout, args: T{f(3), f(2, 3)}, wantErr: gpuhost.ErrShape},
		{name: "embedding-float-ids", op: abi.OpEmbedding, args: T{f(3), f(4, 2)}, wantErr: gpuhost.ErrArgument, wantMsg: "int32 or int64"},
		{name: "embedding-id-high", op: abi.OpEmbedding, args: T{ints(abi.DTypeInt64, 0, 4, 1), f(4, 2)}, wantErr: gpuhost.ErrArgument, wantMsg: "id 4 at index 1"},
		{name: "embedding-id-negative", op: abi.OpEmbedding, args: T{ints(abi.DTypeInt32, -1), f(4, 2)}, wantErr: gpuhost.ErrArgument, wantMsg: "outside [0, 4)"},
		{name: "embedding-id-min", op: abi.OpEmbedding, args: T{ints(abi.DTypeInt64, math.MinInt64), f(4, 2)}, wantErr: gpuhost.ErrArgument},
		{name: "embedding-table-1d", op: abi.OpEmbedding, args: T{ints(abi.DTypeInt64, 0), f(4)}, wantErr: gpuhost.ErrShape},
		{name: "cast-dtype-int64", op: abi.OpCast, args: T{ints(abi.DTypeInt64, 1)}, attrs: []float64{float64(abi.DTypeInt64)}, wantErr: gpuhost.ErrArgument, wantMsg: "dtype 5: ABI v1 casts to float32 (1) only"},
		{name: "cast-float16", op: abi.OpCast, args: T{mustZeros(t, dev, abi.DTypeFloat16, 2)}, wantErr: gpuhost.ErrArgument, wantMsg: "dtype float16, want float32, int32, int64 or bool"},
		{name: "cast-two-args", op: abi.OpCast, args: T{f(2), f(2)}, wantErr: gpuhost.ErrArgument},
		{name: "cross_entropy-target", op: abi.OpCrossEntropy, args: T{f(2, 3), ints(abi.DTypeInt64, 0, 3)}, wantErr: gpuhost.ErrArgument, wantMsg: "target 3 of row 1"},
		{name: "cross_entropy-rows", op: abi.OpCrossEntropy, args: T{f(2, 3), ints(abi.DTypeInt64, 0)}, wantErr: gpuhost.ErrShape},
		{name: "cross_entropy-reduction", op: abi.OpCrossEntropy, args: T{f(2, 3), ints(abi.DTypeInt64, 0, 1)}, attrs: []float64{3}, wantErr: gpuhost.ErrArgument},
		{name: "cross_entropy-ignore-fraction", op: abi.OpCrossEntropy, args: T{f(2, 3), ints(abi.DTypeInt64, 0, 1)}, attrs: []float64{0, 0.5}, wantErr: gpuhost.ErrArgument},
		{name: "batch_matmul-k", op: abi.OpBatchMatMul, args: T{f(2, 3, 4), f(2, 3, 4)}, wantErr: gpuhost.ErrShape},
		{name: "batch_matmul-lead", op: abi.OpBatchMatMul, args: T{f(2, 3, 4), f(3, 4, 2)}, wantErr: gpuhost.ErrShape, wantMsg: "leading dims"},
		{name: "batch_matmul-1d", op: abi.OpBatchMatMul, args: T{f(4), f(4, 2)}, wantErr: gpuhost.ErrShape},
		{name: "attention-3d", op: abi.OpAttention, args: T{f(2, 3, 4), k, v}, wantErr: gpuhost.ErrShape},
		{name: "attention-kv", op: abi.OpAttention, args: T{q, k, f(2, 2, 4, 3)}, wantErr: gpuhost.ErrShape},
		{name: "attention-float-mask", op: abi.OpAttention, args: T{q, k, v, f(2, 5)}, wantErr: gpuhost.ErrArgument, wantMsg: "want bool"},
		{name: "attention-mask-shape", op: abi.OpAttention, args: T{q, k, v, f(2, 3)}, wantErr: gpuhost.ErrArgument},
		{name: "attention-causal-flag", op: abi.OpAttention, args: T{q, k, v, mask}, attrs: []float64{2}, wantErr: gpuhost.ErrArgument},
		{name: "attention-scale-nan", op: abi.OpAttention, args: T{q, k, v}, attrs: []float64{0, nan}, wantErr: gpuhost.ErrArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tape := gpuhost.NewTape()
			out, err := gpuhost.Apply(dev, tape, tt.op, tt.args, tt.attrs)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Apply error = %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.op.String()) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("message %q does not name %s and %q", err, tt.op, tt.wantMsg)
			}
			if out != nil || tape.Len() != 0 {
				t.Errorf("failed Apply returned %v and recorded %d ops", out, tape.Len())
			}
		})
	}
}

// TestApplyMulti checks the multi-result form: one result for single
// ops, one per section for split, and backward with some section
// gradients missing.
func TestApplyMulti(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(1)
	x := mustTensor(t, dev, []int{2, 3}, []float64{1, 2, 3, 4, 5, 6})
	outs, err := gpuhost.ApplyMulti(dev, nil, abi.OpNeg, []*gpuhost.Tensor{x}, nil)
	if err != nil || len(outs) != 1 {
		t.Fatalf("ApplyMulti(neg) = %d results, %v; want 1", len(outs), err)
	}
	if got, want := mustFloats(t, dev, outs[0]), []float32{-1, -2, -3, -4, -5, -6}; !slices.Equal(got, want) {
		t.Errorf("neg = %v, want %v", got, want)
	}
	tape := gpuhost.NewTape()
	parts, err := gpuhost.ApplyMulti(dev, tape, abi.OpSplit, []*gpuhost.Tensor{x}, []float64{1, 1, 2})
	if err != nil || len(parts) != 2 {
		t.Fatalf("ApplyMulti(split) = %d results, %v; want 2", len(parts), err)
	}
	for i, want := range []struct {
		shape []int
		vals  []float32
	}{{[]int{2, 1}, []float32{1, 4}}, {[]int{2, 2}, []float32{2, 3, 5, 6}}} {
		if got := mustFloats(t, dev, parts[i]); !slices.Equal(got, want.vals) || !slices.Equal(parts[i].Shape(), want.shape) {
			t.Errorf("split part %d = %v%v, want %v%v", i, parts[i].Shape(), got, want.shape, want.vals)
		}
	}
	// Only the second part feeds the loss; the first gets no gradient.
	g1 := mustTensor(t, dev, []int{2, 2}, []float64{1, 2, 3, 4})
	g, err := tape.Backward(dev, parts[1:], []*gpuhost.Tensor{g1}, []*gpuhost.Tensor{x})
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{0, 1, 2, 0, 3, 4}
	if got := mustFloats(t, dev, g[0]); !slices.Equal(got, want) {
		t.Errorf("d/dx = %v, want %v", got, want)
	}
	if _, err := gpuhost.ApplyMulti(dev, nil, abi.OpSplit, []*gpuhost.Tensor{x}, []float64{1, 1, 1}); !errors.Is(err, gpuhost.ErrShape) {
		t.Errorf("split with sizes that do not add up: %v, want ErrShape", err)
	}
}

// TestCrossEntropyAllIgnored checks torch's behaviour when every row is
// ignored: the mean is NaN, the sum 0, and the gradient zero.
func TestCrossEntropyAllIgnored(t *testing.T) {
	t.Parallel()
	dev := gpuhost.NewCPU(1)
	logits := mustTensor(t, dev, []int{2, 3}, []float64{1, 2, 3, 4, 5, 6})
	b := make([]byte, 16)
	ignore := int64(-100)
	for i := range 2 {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(ignore))
	}
	tg, err := dev.FromBytes(abi.DTypeInt64, []int{2}, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, red := range []float64{1, 2} {
		tape := gpuhost.NewTape()
		out, err := gpuhost.Apply(dev, tape, abi.OpCrossEntropy, []*gpuhost.Tensor{logits, tg}, []float64{red})
		if err != nil {
			t.Fatal(err)
		}
		v := mustFloats(t, dev, out)[0]
		if red == 1 && !math.IsNaN(float64(v)) || red == 2 && v != 0 {
			t.Errorf("reduction %v: loss %v", red, v)
		}
		g, err := tape.Backward(dev, []*gpuhost.Tensor{out}, []*gpuhost.Tensor{mustTensor(t, dev, []int{1}, []float64{1})}, []*gpuhost.Tensor{logits})
		if err != nil {
			t.Fatal(err)
		}
		if got := mustFloats(t, dev, g[0]); !slices.Equal(got, make([]float32, 6)) {
			t.Errorf("reduction %v: gradient %v, want zeros", red, got)
		}
	}
}
