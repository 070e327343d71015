package gpuhost_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/internal/testing/ref"
)

// argKind says how TestOpGradients makes one arg.
type argKind int

const (
	kFloat   argKind = iota // float32 uniform in the case's range
	kPos                    // float32 uniform in [0.5, 2)
	kMask01                 // float32 0|1 (dropout's mask); gets no gradient
	kIDs64                  // int64 ids in [0, ids)
	kIDs32                  // int32 ids in [0, ids)
	kTarget                 // int64 targets in [0, ids), row 1 = ignore
	kPadMask                // bool [B,Tk]: batch 0 pads its last key, batch 1 all keys, others none
	kWide64                 // int64 of any sign up to ±2^53 (exact in float64, rounded in float32)
	kWide32                 // int32 of any sign
)

// opCase is one row of the gradient table.
type opCase struct {
	name   string
	op     abi.Op
	shapes [][]int
	attrs  []float64
	lo, hi float64   // range of kFloat; default [-1, 1)
	kinds  []argKind // by arg; missing ones are kFloat
	ids    int       // range of ids and targets
	ignore float64   // the ignore target of kTarget; default -100
}

// gradCases covers every op; TestOpGradients fails for an op without one.
var gradCases = []opCase{
	{name: "matmul", op: abi.OpMatMul, shapes: [][]int{{3, 5}, {5, 4}}},
	{name: "matmul-ta", op: abi.OpMatMul, shapes: [][]int{{5, 3}, {5, 4}}, attrs: []float64{1}},
	{name: "matmul-tb", op: abi.OpMatMul, shapes: [][]int{{3, 5}, {4, 5}}, attrs: []float64{0, 1}},
	{name: "matmul-ta-tb", op: abi.OpMatMul, shapes: [][]int{{5, 3}, {4, 5}}, attrs: []float64{1, 1}},
	{name: "matmul-odd", op: abi.OpMatMul, shapes: [][]int{{7, 9}, {9, 1}}, attrs: []float64{0, 0}},
	{name: "matmul-vector-rows", op: abi.OpMatMul, shapes: [][]int{{1, 6}, {6, 5}}},
	{name: "linear-bias", op: abi.OpLinear, shapes: [][]int{{3, 5}, {4, 5}, {4}}},
	{name: "linear-no-bias", op: abi.OpLinear, shapes: [][]int{{3, 5}, {4, 5}}},
	{name: "linear-rank3", op: abi.OpLinear, shapes: [][]int{{2, 3, 5}, {6, 5}, {6}}},
	{name: "linear-rank3-no-bias", op: abi.OpLinear, shapes: [][]int{{2, 3, 5}, {6, 5}}},
	{name: "linear-rank1", op: abi.OpLinear, shapes: [][]int{{5}, {3, 5}, {3}}},
	{name: "linear-one-row", op: abi.OpLinear, shapes: [][]int{{1, 5}, {3, 5}, {3}}},
	{name: "add-same", op: abi.OpAdd, shapes: [][]int{{3, 4}, {3, 4}}},
	{name: "add-bcast-right", op: abi.OpAdd, shapes: [][]int{{2, 3, 4}, {4}}},
	{name: "add-bcast-left", op: abi.OpAdd, shapes: [][]int{{4}, {2, 3, 4}}},
	{name: "add-bcast-right-2d", op: abi.OpAdd, shapes: [][]int{{2, 3, 4}, {3, 4}}},
	{name: "add-bcast-left-2d", op: abi.OpAdd, shapes: [][]int{{3, 4}, {2, 3, 4}}},
	{name: "add-bcast-unit-lead", op: abi.OpAdd, shapes: [][]int{{1, 4}, {4}}},
	{name: "add-scalar", op: abi.OpAdd, shapes: [][]int{{}, {2, 3}}},
	{name: "add-bcast-long-runs", op: abi.OpAdd, shapes: [][]int{{2, 3, 21}, {3, 21}}}, // runs of 63: vector and tail
	{name: "gelu_tanh", op: abi.OpGeluTanh, shapes: [][]int{{2, 3, 4}}, lo: -4, hi: 4},
	{name: "gelu_tanh-1d", op: abi.OpGeluTanh, shapes: [][]int{{7}}, lo: -1, hi: 1},
	{name: "layer_norm", op: abi.OpLayerNorm, shapes: [][]int{{4, 6}, {6}, {6}}},
	{name: "layer_norm-rank3-eps", op: abi.OpLayerNorm, shapes: [][]int{{2, 3, 5}, {5}, {5}}, attrs: []float64{1e-3}},
	{name: "layer_norm-1d", op: abi.OpLayerNorm, shapes: [][]int{{8}, {8}, {8}}, attrs: []float64{1e-12}},

	{name: "sub-same", op: abi.OpSub, shapes: [][]int{{3, 4}, {3, 4}}},
	{name: "sub-bcast-right", op: abi.OpSub, shapes: [][]int{{2, 3, 4}, {3, 4}}},
	{name: "sub-bcast-left", op: abi.OpSub, shapes: [][]int{{4}, {2, 3, 4}}},
	{name: "mul-same", op: abi.OpMul, shapes: [][]int{{3, 4}, {3, 4}}},
	{name: "mul-bcast-right", op: abi.OpMul, shapes: [][]int{{2, 3, 4}, {4}}},
	{name: "mul-bcast-left", op: abi.OpMul, shapes: [][]int{{3, 4}, {2, 3, 4}}},
	{name: "mul-self-shapes-scalar", op: abi.OpMul, shapes: [][]int{{}, {5}}},
	{name: "div-same", op: abi.OpDiv, shapes: [][]int{{3, 4}, {3, 4}}, kinds: []argKind{kFloat, kPos}},
	{name: "div-bcast-right", op: abi.OpDiv, shapes: [][]int{{2, 3, 4}, {4}}, kinds: []argKind{kFloat, kPos}},
	{name: "div-bcast-left", op: abi.OpDiv, shapes: [][]int{{3, 4}, {2, 3, 4}}, kinds: []argKind{kFloat, kPos}},
	{name: "scale", op: abi.OpScale, shapes: [][]int{{2, 5}}, attrs: []float64{-2.5}},
	{name: "scale-default", op: abi.OpScale, shapes: [][]int{{4}}},
	{name: "add_scalar", op: abi.OpAddScalar, shapes: [][]int{{2, 5}}, attrs: []float64{0.75}},
	{name: "relu", op: abi.OpRelu, shapes: [][]int{{3, 7}}},
	{name: "gelu", op: abi.OpGelu, shapes: [][]int{{2, 3, 4}}, lo: -4, hi: 4},
	{name: "tanh", op: abi.OpTanh, shapes: [][]int{{3, 5}}, lo: -3, hi: 3},
	{name: "sigmoid", op: abi.OpSigmoid, shapes: [][]int{{3, 5}}, lo: -4, hi: 4},
	{name: "silu", op: abi.OpSilu, shapes: [][]int{{3, 5}}, lo: -4, hi: 4},
	{name: "exp", op: abi.OpExp, shapes: [][]int{{3, 5}}, lo: -2, hi: 2},
	{name: "log", op: abi.OpLog, shapes: [][]int{{3, 5}}, kinds: []argKind{kPos}},
	{name: "sqrt", op: abi.OpSqrt, shapes: [][]int{{3, 5}}, kinds: []argKind{kPos}},
	{name: "neg", op: abi.OpNeg, shapes: [][]int{{2, 2, 3}}},
	{name: "softmax", op: abi.OpSoftmax, shapes: [][]int{{3, 6}}, lo: -3, hi: 3},
	{name: "softmax-axis0", op: abi.OpSoftmax, shapes: [][]int{{4, 3, 2}}, attrs: []float64{0}},
	{name: "softmax-axis-2", op: abi.OpSoftmax, shapes: [][]int{{2, 4, 3}}, attrs: []float64{-2}},
	{name: "log_softmax", op: abi.OpLogSoftmax, shapes: [][]int{{3, 6}}, lo: -3, hi: 3},
	{name: "log_softmax-axis1", op: abi.OpLogSoftmax, shapes: [][]int{{2, 5, 3}}, attrs: []float64{1}},
	{name: "rms_norm", op: abi.OpRMSNorm, shapes: [][]int{{4, 6}, {6}}},
	{name: "rms_norm-rank3-eps", op: abi.OpRMSNorm, shapes: [][]int{{2, 3, 5}, {5}}, attrs: []float64{1e-2}},
	{name: "reshape", op: abi.OpReshape, shapes: [][]int{{2, 3, 4}}, attrs: []float64{4, -1}},
	{name: "reshape-rank4", op: abi.OpReshape, shapes: [][]int{{6, 4}}, attrs: []float64{2, 3, 2, 2}},
	{name: "reshape-scalar", op: abi.OpReshape, shapes: [][]int{{1, 1}}},
	{name: "permute", op: abi.OpPermute, shapes: [][]int{{2, 3, 4}}, attrs: []float64{2, 0, 1}},
	{name: "permute-4d", op: abi.OpPermute, shapes: [][]int{{2, 3, 2, 4}}, attrs: []float64{0, 2, 1, -1}},
	{name: "transpose", op: abi.OpTranspose, shapes: [][]int{{2, 3, 4}}, attrs: []float64{0, 2}},
	{name: "transpose-neg", op: abi.OpTranspose, shapes: [][]int{{3, 5}}, attrs: []float64{-1, -2}},
	{name: "concat-axis0", op: abi.OpConcat, shapes: [][]int{{2, 3}, {1, 3}, {3, 3}}},
	{name: "concat-axis1", op: abi.OpConcat, shapes: [][]int{{2, 3, 2}, {2, 1, 2}}, attrs: []float64{1}},
	{name: "concat-last", op: abi.OpConcat, shapes: [][]int{{2, 3}, {2, 4}}, attrs: []float64{-1}},
	{name: "concat-one", op: abi.OpConcat, shapes: [][]int{{4}}},
	{name: "slice", op: abi.OpSlice, shapes: [][]int{{5, 3}}, attrs: []float64{0, 1, 4}},
	{name: "slice-inner", op: abi.OpSlice, shapes: [][]int{{2, 6, 3}}, attrs: []float64{-2, 2, 6}},
	{name: "split", op: abi.OpSplit, shapes: [][]int{{2, 7, 3}}, attrs: []float64{1, 2, 4, 1}},
	{name: "split-last", op: abi.OpSplit, shapes: [][]int{{3, 6}}, attrs: []float64{-1, 3, 3}},
	{name: "sum", op: abi.OpSum, shapes: [][]int{{3, 4}}},
	{name: "sum-axis0-keep", op: abi.OpSum, shapes: [][]int{{3, 4, 2}}, attrs: []float64{0, 1}},
	{name: "sum-1d", op: abi.OpSum, shapes: [][]int{{5}}},
	{name: "mean", op: abi.OpMean, shapes: [][]int{{3, 4, 2}}, attrs: []float64{1}},
	{name: "mean-keep", op: abi.OpMean, shapes: [][]int{{3, 4}}, attrs: []float64{-1, 1}},
	{name: "max", op: abi.OpMax, shapes: [][]int{{3, 5}}},
	{name: "max-axis1-keep", op: abi.OpMax, shapes: [][]int{{2, 4, 3}}, attrs: []float64{1, 1}},
	{name: "dropout", op: abi.OpDropout, shapes: [][]int{{3, 4}, {3, 4}}, attrs: []float64{0.8}, kinds: []argKind{kFloat, kMask01}},
	{name: "dropout-bcast-mask", op: abi.OpDropout, shapes: [][]int{{2, 3, 4}, {4}}, attrs: []float64{0.5}, kinds: []argKind{kFloat, kMask01}},
	{name: "embedding-int64", op: abi.OpEmbedding, shapes: [][]int{{2, 3}, {5, 4}}, kinds: []argKind{kIDs64}, ids: 5},
	{name: "embedding-int32", op: abi.OpEmbedding, shapes: [][]int{{7}, {3, 2}}, kinds: []argKind{kIDs32}, ids: 3},
	{name: "cross_entropy-none", op: abi.OpCrossEntropy, shapes: [][]int{{4, 5}, {4}}, kinds: []argKind{kFloat, kTarget}, ids: 5, lo: -2, hi: 2},
	{name: "cross_entropy-mean", op: abi.OpCrossEntropy, shapes: [][]int{{4, 5}, {4}}, attrs: []float64{1}, kinds: []argKind{kFloat, kTarget}, ids: 5},
	{name: "cross_entropy-sum-ignore", op: abi.OpCrossEntropy, shapes: [][]int{{3, 4}, {3}}, attrs: []float64{2, 3}, kinds: []argKind{kFloat, kTarget}, ids: 3, ignore: 3},
	{name: "batch_matmul", op: abi.OpBatchMatMul, shapes: [][]int{{2, 3, 4}, {2, 4, 5}}},
	{name: "batch_matmul-ta-tb", op: abi.OpBatchMatMul, shapes: [][]int{{2, 2, 4, 3}, {2, 2, 5, 4}}, attrs: []float64{1, 1}},
	{name: "batch_matmul-bcast-b", op: abi.OpBatchMatMul, shapes: [][]int{{2, 3, 3, 4}, {3, 4, 2}}, attrs: []float64{0, 0}},
	{name: "batch_matmul-bcast-a-tb", op: abi.OpBatchMatMul, shapes: [][]int{{3, 4}, {2, 3, 5, 4}}, attrs: []float64{0, 1}},
	{name: "batch_matmul-bcast-a-ta", op: abi.OpBatchMatMul, shapes: [][]int{{4, 3}, {2, 4, 5}}, attrs: []float64{1}},
	{name: "attention", op: abi.OpAttention, shapes: [][]int{{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}}},
	{name: "attention-mask", op: abi.OpAttention, shapes: [][]int{{3, 2, 4, 4}, {3, 2, 4, 4}, {3, 2, 4, 2}, {3, 4}}, kinds: []argKind{kFloat, kFloat, kFloat, kPadMask}},
	{name: "attention-causal", op: abi.OpAttention, shapes: [][]int{{1, 2, 4, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}}, attrs: []float64{1}},
	{name: "attention-causal-tk>tq-scale", op: abi.OpAttention, shapes: [][]int{{2, 1, 2, 3}, {2, 1, 5, 3}, {2, 1, 5, 2}}, attrs: []float64{1, 0.7}},
	// The fused ops, on shapes small enough for the plain loop and large
	// enough for the GEMM's epilogue (edge tiles, both thread splits).
	{name: "linear_gelu_tanh", op: abi.OpLinearGeluTanh, shapes: [][]int{{3, 5}, {4, 5}, {4}}, lo: -2, hi: 2},
	{name: "linear_gelu_tanh-no-bias-rank3", op: abi.OpLinearGeluTanh, shapes: [][]int{{2, 3, 5}, {6, 5}}, lo: -2, hi: 2},
	{name: "linear_gelu_tanh-rank1", op: abi.OpLinearGeluTanh, shapes: [][]int{{5}, {3, 5}, {3}}},
	{name: "linear_gelu_tanh-epilogue", op: abi.OpLinearGeluTanh, shapes: [][]int{{50, 24}, {37, 24}, {37}}, lo: -2, hi: 2},
	{name: "add_layer_norm", op: abi.OpAddLayerNorm, shapes: [][]int{{4, 6}, {4, 6}, {6}, {6}}},
	{name: "add_layer_norm-bcast-r-eps", op: abi.OpAddLayerNorm, shapes: [][]int{{2, 3, 5}, {3, 5}, {5}, {5}}, attrs: []float64{1e-3}},
	{name: "add_layer_norm-bcast-x", op: abi.OpAddLayerNorm, shapes: [][]int{{7}, {3, 7}, {7}, {7}}, attrs: []float64{1e-12}},
	{name: "cast-int64", op: abi.OpCast, shapes: [][]int{{3, 4}}, kinds: []argKind{kWide64}},
	{name: "cast-int32", op: abi.OpCast, shapes: [][]int{{2, 3, 2}}, kinds: []argKind{kWide32}, attrs: []float64{1}},
	{name: "cast-bool", op: abi.OpCast, shapes: [][]int{{3, 4}}, kinds: []argKind{kPadMask}},
	{name: "cast-float32", op: abi.OpCast, shapes: [][]int{{2, 5}}},
	{name: "attention-causal-tq>tk-mask", op: abi.OpAttention, shapes: [][]int{{2, 1, 5, 3}, {2, 1, 3, 3}, {2, 1, 3, 2}, {2, 3}}, attrs: []float64{1}, kinds: []argKind{kFloat, kFloat, kFloat, kPadMask}},
}

// makeArg returns the float64 values of an arg and the tensor on dev.
func makeArg(t *testing.T, dev gpuhost.Device, rng *rand.Rand, tc opCase, j int, lo, hi float64) ([]float64, *gpuhost.Tensor) {
	t.Helper()
	s := tc.shapes[j]
	n := numel(s)
	kind := kFloat
	if j < len(tc.kinds) {
		kind = tc.kinds[j]
	}
	ints := func(dt abi.DType, v []float64) *gpuhost.Tensor {
		b := make([]byte, n*dt.Size())
		for i, e := range v {
			if dt == abi.DTypeInt32 {
				binary.LittleEndian.PutUint32(b[4*i:], uint32(int32(e)))
			} else if dt == abi.DTypeInt64 {
				binary.LittleEndian.PutUint64(b[8*i:], uint64(int64(e)))
			} else if e != 0 {
				b[i] = 1
			}
		}
		x, err := dev.FromBytes(dt, s, b)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	v := make([]float64, n)
	switch kind {
	case kFloat:
		v = randVals(rng, n, lo, hi)
	case kPos:
		v = randVals(rng, n, 0.5, 2)
	case kMask01:
		for i := range v {
			v[i] = float64(i % 2) // half dropped, whatever the seed
		}
		rng.Shuffle(n, func(a, b int) { v[a], v[b] = v[b], v[a] })
	case kIDs64, kIDs32:
		for i := range v {
			v[i] = float64(rng.IntN(tc.ids))
		}
		if kind == kIDs32 {
			return v, ints(abi.DTypeInt32, v)
		}
		return v, ints(abi.DTypeInt64, v)
	case kTarget:
		ign := tc.ignore
		if ign == 0 {
			ign = -100
		}
		for i := range v {
			for v[i] = float64(rng.IntN(tc.ids)); v[i] == ign; {
				v[i] = float64(rng.IntN(tc.ids))
			}
		}
		if n > 1 {
			v[1] = ign
		}
		return v, ints(abi.DTypeInt64, v)
	case kWide64, kWide32:
		// Magnitudes from 0 to about 2^52 (2^30 for int32), so that most
		// round in float32.
		top := 52
		if kind == kWide32 {
			top = 30
		}
		for i := range v {
			v[i] = float64(rng.Int64N(1 << rng.IntN(top+1)))
			if rng.IntN(2) == 0 {
				v[i] = -v[i]
			}
		}
		if kind == kWide32 {
			return v, ints(abi.DTypeInt32, v)
		}
		return v, ints(abi.DTypeInt64, v)
	case kPadMask:
		tk := s[1]
		v[tk-1] = 1
		if s[0] > 1 {
			for i := range tk {
				v[tk+i] = 1
			}
		}
		return v, ints(abi.DTypeBool, v)
	}
	return v, mustTensor(t, dev, s, v)
}

// TestOpGradients checks every op's forward against the float64 reference
// and its autograd gradient of Σ out·R against central differences of that
// reference, for every float32 arg.
func TestOpGradients(t *testing.T) {
	t.Parallel()
	covered := map[abi.Op]bool{}
	for _, tc := range gradCases {
		covered[tc.op] = true
	}
	for _, op := range abi.Ops() {
		if !covered[op] {
			t.Errorf("op %s (%d) has no gradient test case", op, op)
		}
	}
	for _, d := range devices() {
		for i, tt := range gradCases {
			t.Run(d.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(42, uint64(i)))
				lo, hi := tt.lo, tt.hi
				if lo == 0 && hi == 0 {
					lo, hi = -1, 1
				}
				in := make([][]float64, len(tt.shapes))
				args := make([]*gpuhost.Tensor, len(tt.shapes))
				var wrt []*gpuhost.Tensor
				var wrtIdx []int
				perturb := make([]bool, len(tt.shapes))
				for j := range tt.shapes {
					in[j], args[j] = makeArg(t, d.dev, rng, tt, j, lo, hi)
					if args[j].DType() == abi.DTypeFloat32 {
						wrt, wrtIdx = append(wrt, args[j]), append(wrtIdx, j)
						perturb[j] = j >= len(tt.kinds) || tt.kinds[j] != kMask01
					}
				}
				tape := gpuhost.NewTape()
				outs, err := gpuhost.ApplyMulti(d.dev, tape, tt.op, args, tt.attrs)
				if err != nil {
					t.Fatalf("ApplyMulti: %v", err)
				}
				if tape.Len() != 1 {
					t.Errorf("tape.Len() = %d, want 1", tape.Len())
				}
				var got []float32
				for _, o := range outs {
					got = append(got, mustFloats(t, d.dev, o)...)
				}
				want := refOp(t, tt.op, in, tt.shapes, tt.attrs)
				if len(want) != len(got) {
					t.Fatalf("outputs have %d elements, reference %d", len(got), len(want))
				}
				if e := ref.RelErr(got, want); e > 1e-5 {
					t.Errorf("forward relative error %.3g > 1e-5", e)
				}
				// Without a tape (a forward request), as fused ops run
				// another way then.
				plain, err := gpuhost.ApplyMulti(d.dev, nil, tt.op, args, tt.attrs)
				if err != nil {
					t.Fatalf("ApplyMulti without a tape: %v", err)
				}
				var gotPlain []float32
				for _, o := range plain {
					gotPlain = append(gotPlain, mustFloats(t, d.dev, o)...)
				}
				if e := ref.RelErr(gotPlain, want); e > 1e-5 {
					t.Errorf("forward without a tape: relative error %.3g > 1e-5", e)
				}

				r := randVals(rng, len(got), -1, 1)
				gouts := make([]*gpuhost.Tensor, len(outs))
				off := 0
				for j, o := range outs {
					gouts[j] = mustTensor(t, d.dev, o.Shape(), r[off:off+o.Len()])
					off += o.Len()
				}
				grads, err := tape.Backward(d.dev, outs, gouts, wrt)
				if err != nil {
					t.Fatalf("Backward: %v", err)
				}
				fd := finiteDiffSome(in, perturb, func(x [][]float64) float64 {
					return ref.Dot(refOp(t, tt.op, x, tt.shapes, tt.attrs), r)
				})
				for w, g := range grads {
					j := wrtIdx[w]
					if !slices.Equal(g.Shape(), tt.shapes[j]) {
						t.Errorf("grad %d has shape %v, want %v", j, g.Shape(), tt.shapes[j])
						continue
					}
					gv := mustFloats(t, d.dev, g)
					if !perturb[j] {
						if slices.ContainsFunc(gv, func(v float32) bool { return v != 0 }) {
							t.Errorf("grad of arg %d (no gradient flows to it) = %v, want zeros", j, gv)
						}
						continue
					}
					if e := ref.RelErr(gv, fd[j]); e > 1e-3 {
						t.Errorf("grad of arg %d: relative error %.3g > 1e-3", j, e)
					}
				}
			})
		}
	}
}

// ffnParams are the shapes of the ffn block's x and six params for hidden h
// and batch n.
func ffnShapes(n, h int) [][]int {
	return [][]int{{n, h}, {4 * h, h}, {4 * h}, {h, 4 * h}, {h}, {h}, {h}}
}

// refFFN is LayerNorm(x + Linear2(gelu(Linear1(x)))) in float64.
func refFFN(in [][]float64, shapes [][]int, eps float64) []float64 {
	x, w1, b1, w2, b2, lw, lb := in[0], in[1], in[2], in[3], in[4], in[5], in[6]
	hid := ref.GeluTanh(ref.Linear(x, w1, b1, shapes[1][1], shapes[1][0]))
	y := ref.Linear(hid, w2, b2, shapes[3][1], shapes[3][0])
	return ref.LayerNorm(ref.Add(x, y), lw, lb, eps)
}

// applyFFNFused runs the ffn block as the ffn example does, with the
// fused ops: linear_gelu_tanh, linear, add_layer_norm.
func applyFFNFused(dev gpuhost.Device, tape *gpuhost.Tape, p []*gpuhost.Tensor, eps float64) (*gpuhost.Tensor, error) {
	h, err := gpuhost.Apply(dev, tape, abi.OpLinearGeluTanh, p[0:3], nil)
	if err != nil {
		return nil, err
	}
	y, err := gpuhost.Apply(dev, tape, abi.OpLinear, []*gpuhost.Tensor{h, p[3], p[4]}, nil)
	if err != nil {
		return nil, err
	}
	return gpuhost.Apply(dev, tape, abi.OpAddLayerNorm, []*gpuhost.Tensor{p[0], y, p[5], p[6]}, []float64{eps})
}

// applyFFN runs the ffn block on dev, recording on tape.
func applyFFN(dev gpuhost.Device, tape *gpuhost.Tape, p []*gpuhost.Tensor, eps float64) (*gpuhost.Tensor, error) {
	h, err := gpuhost.Apply(dev, tape, abi.OpLinear, p[0:3], nil)
	if err != nil {
		return nil, err
	}
	if h, err = gpuhost.Apply(dev, tape, abi.OpGeluTanh, []*gpuhost.Tensor{h}, nil); err != nil {
		return nil, err
	}
	y, err := gpuhost.Apply(dev, tape, abi.OpLinear, []*gpuhost.Tensor{h, p[3], p[4]}, nil)
	if err != nil {
		return nil, err
	}
	// The residual: x feeds both linear1 and this add.
	if y, err = gpuhost.Apply(dev, tape, abi.OpAdd, []*gpuhost.Tensor{p[0], y}, nil); err != nil {
		return nil, err
	}
	return gpuhost.Apply(dev, tape, abi.OpLayerNorm, []*gpuhost.Tensor{y, p[5], p[6]}, []float64{eps})
}

// TestFFNGradients checks hivemind's ffn block end to end: the gradient
// wrt x (used twice) and all six params.
func TestFFNGradients(t *testing.T) {
	t.Parallel()
	const eps = 1e-12
	shapes := ffnShapes(3, 8)
	for _, d := range devices() {
		for _, fused := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fused=%t", d.name, fused), func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(7, 7))
				in := make([][]float64, len(shapes))
				p := make([]*gpuhost.Tensor, len(shapes))
				for i, s := range shapes {
					lo, hi := -1.0, 1.0
					if i == 5 {
						lo, hi = 0.5, 1.5 // layer-norm gain
					}
					in[i] = randVals(rng, numel(s), lo, hi)
					p[i] = mustTensor(t, d.dev, s, in[i])
				}
				tape := gpuhost.NewTape()
				apply, ops := applyFFN, 5
				if fused {
					apply, ops = applyFFNFused, 3
				}
				out, err := apply(d.dev, tape, p, eps)
				if err != nil {
					t.Fatalf("ffn: %v", err)
				}
				if tape.Len() != ops {
					t.Errorf("tape.Len() = %d, want %d", tape.Len(), ops)
				}
				if e := ref.RelErr(mustFloats(t, d.dev, out), refFFN(in, shapes, eps)); e > 1e-5 {
					t.Errorf("forward relative error %.3g > 1e-5", e)
				}
				r := randVals(rng, out.Len(), -1, 1)
				grads, err := tape.Backward(d.dev, []*gpuhost.Tensor{out}, []*gpuhost.Tensor{mustTensor(t, d.dev, out.Shape(), r)}, p)
				if err != nil {
					t.Fatalf("Backward: %v", err)
				}
				fd := finiteDiff(in, func(x [][]float64) float64 { return ref.Dot(refFFN(x, shapes, eps), r) })
				names := []string{"x", "W1", "b1", "W2", "b2", "ln.w", "ln.b"}
				for i, g := range grads {
					if e := ref.RelErr(mustFloats(t, d.dev, g), fd[i]); e > 1e-3 {
						t.Errorf("grad %s: relative error %.3g > 1e-3", names[i], e)
					}
				}
			})
		}
	}
}

// TestBackwardSemantics covers what Backward promises besides the math.
func TestBackwardSemantics(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			dev := d.dev
			x := mustTensor(t, dev, []int{2, 3}, []float64{1, 2, 3, 4, 5, 6})
			unused := mustTensor(t, dev, []int{4}, []float64{1, 1, 1, 1})
			tape := gpuhost.NewTape()
			y, err := gpuhost.Apply(dev, tape, abi.OpAdd, []*gpuhost.Tensor{x, x}, nil)
			if err != nil {
				t.Fatal(err)
			}
			gy := mustTensor(t, dev, []int{2, 3}, []float64{1, -1, 2, -2, 3, -3})

			t.Run("self-add-accumulates-and-unreached-is-zero", func(t *testing.T) {
				for round := range 2 { // the tape can be replayed
					g, err := tape.Backward(dev, []*gpuhost.Tensor{y}, []*gpuhost.Tensor{gy}, []*gpuhost.Tensor{x, unused, y, x})
					if err != nil {
						t.Fatal(err)
					}
					if got, want := mustFloats(t, dev, g[0]), []float32{2, -2, 4, -4, 6, -6}; !slices.Equal(got, want) {
						t.Errorf("round %d: d/dx = %v, want %v", round, got, want)
					}
					if got := mustFloats(t, dev, g[1]); !slices.Equal(got, []float32{0, 0, 0, 0}) || !slices.Equal(g[1].Shape(), []int{4}) {
						t.Errorf("unreached grad = %v %v, want zeros [4]", got, g[1].Shape())
					}
					if got := mustFloats(t, dev, g[2]); !slices.Equal(got, mustFloats(t, dev, gy)) {
						t.Errorf("d/dy = %v, want gy", got)
					}
					if g[0] == g[3] || g[2] == gy {
						t.Errorf("returned gradients alias each other or the caller's tensors")
					}
				}
				if got := mustFloats(t, dev, gy); !slices.Equal(got, []float32{1, -1, 2, -2, 3, -3}) {
					t.Errorf("gradOutput was modified: %v", got)
				}
			})

			errTests := []struct {
				name    string
				outs    []*gpuhost.Tensor
				gouts   []*gpuhost.Tensor
				wrt     []*gpuhost.Tensor
				wantErr error
			}{
				{name: "grad-shape", outs: []*gpuhost.Tensor{y}, gouts: []*gpuhost.Tensor{unused}, wrt: []*gpuhost.Tensor{x}, wantErr: gpuhost.ErrShape},
				{name: "count", outs: []*gpuhost.Tensor{y}, gouts: nil, wrt: []*gpuhost.Tensor{x}, wantErr: gpuhost.ErrArgument},
				{name: "nil-grad", outs: []*gpuhost.Tensor{y}, gouts: []*gpuhost.Tensor{nil}, wrt: []*gpuhost.Tensor{x}, wantErr: gpuhost.ErrArgument},
				{name: "nil-wrt", outs: []*gpuhost.Tensor{y}, gouts: []*gpuhost.Tensor{gy}, wrt: []*gpuhost.Tensor{nil}, wantErr: gpuhost.ErrArgument},
				{name: "other-device", outs: []*gpuhost.Tensor{y}, gouts: []*gpuhost.Tensor{mustTensor(t, gpuhost.NewCPU(1), []int{2, 3}, make([]float64, 6))}, wrt: []*gpuhost.Tensor{x}, wantErr: gpuhost.ErrArgument},
			}
			for _, tt := range errTests {
				t.Run(tt.name, func(t *testing.T) {
					if _, err := tape.Backward(dev, tt.outs, tt.gouts, tt.wrt); !errors.Is(err, tt.wantErr) {
						t.Errorf("Backward error = %v, want %v", err, tt.wantErr)
					}
				})
			}
		})
	}
}

// TestConcurrentUse hammers one device from several goroutines, each with
// its own tensors and tape, on sizes that take the parallel GEMM path.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			dev := d.dev
			shapes := ffnShapes(32, 48)
			run := func(seed uint64) ([]float32, []float32, error) {
				rng := rand.New(rand.NewPCG(seed, 1))
				p := make([]*gpuhost.Tensor, len(shapes))
				for i, s := range shapes {
					var err error
					if p[i], err = dev.FromFloat32(s, to32(randVals(rng, numel(s), -1, 1))); err != nil {
						return nil, nil, err
					}
				}
				tape := gpuhost.NewTape()
				out, err := applyFFN(dev, tape, p, 1e-5)
				if err != nil {
					return nil, nil, err
				}
				gy, err := dev.FromFloat32(out.Shape(), to32(randVals(rng, out.Len(), -1, 1)))
				if err != nil {
					return nil, nil, err
				}
				g, err := tape.Backward(dev, []*gpuhost.Tensor{out}, []*gpuhost.Tensor{gy}, p[1:2])
				if err != nil {
					return nil, nil, err
				}
				o, _ := dev.Float32s(out)
				gw, _ := dev.Float32s(g[0])
				return o, gw, nil
			}
			const workers = 4
			want := make([][2][]float32, workers)
			for w := range workers {
				o, g, err := run(uint64(w))
				if err != nil {
					t.Fatal(err)
				}
				want[w] = [2][]float32{o, g}
			}
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for range 2 {
						o, g, err := run(uint64(w))
						if err != nil {
							t.Error(err)
							return
						}
						if !slices.Equal(o, want[w][0]) || !slices.Equal(g, want[w][1]) {
							t.Errorf("worker %d: concurrent result differs from the serial one", w)
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// BenchmarkFFN runs hivemind's ffn block (batch 64, hidden 1024, inner
// 4096) forward and backward with respect to x and all params.
func BenchmarkFFN(b *testing.B) {
	dev := gpuhost.NewCPU(0)
	shapes := ffnShapes(64, 1024)
	rng := rand.New(rand.NewPCG(1, 1))
	p := make([]*gpuhost.Tensor, len(shapes))
	for i, s := range shapes {
		var err error
		if p[i], err = dev.FromFloat32(s, to32(randVals(rng, numel(s), -0.05, 0.05))); err != nil {
			b.Fatal(err)
		}
	}
	gy, err := dev.FromFloat32([]int{64, 1024}, to32(randVals(rng, 64*1024, -1, 1)))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		tape := gpuhost.NewTape()
		out, err := applyFFN(dev, tape, p, 1e-5)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tape.Backward(dev, []*gpuhost.Tensor{out}, []*gpuhost.Tensor{gy}, p); err != nil {
			b.Fatal(err)
		}
	}
	// Two linears, each 2·64·1024·4096 flops forward and twice that back.
	flops := 3 * 2 * 2 * 64.0 * 1024 * 4096 * float64(b.N)
	b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
