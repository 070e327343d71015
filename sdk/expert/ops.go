package expert

import (
	"errors"

	"github.com/moehost/moehost/abi"
)

// This file has one function per op of ABI v1, in op-code order; package
// abi documents each op's shapes, dtypes and attrs in full. Every function
// returns a Tensor that carries the first error met: the error of an
// argument (without calling the host) or the host's.

// isNone reports whether t is the zero Tensor{}, which optional args use
// for "none" (zero is never a valid handle).
func isNone(t Tensor) bool { return t.h == 0 && t.err == nil }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// MatMul returns op(a)·op(b) for 2-D tensors, transposing where asked
// (abi.OpMatMul).
func MatMul(a, b Tensor, transposeA, transposeB bool) Tensor {
	return op(abi.OpMatMul, []float64{b2f(transposeA), b2f(transposeB)}, a, b)
}

// Linear returns x·wᵀ + b, as torch.nn.functional.linear (abi.OpLinear).
// Pass a zero Tensor{} as b for no bias.
func Linear(x, w, b Tensor) Tensor {
	if isNone(b) {
		return op(abi.OpLinear, nil, x, w)
	}
	return op(abi.OpLinear, nil, x, w, b)
}

// Add returns a + b, broadcasting the smaller along leading dims
// (abi.OpAdd).
func Add(a, b Tensor) Tensor { return op(abi.OpAdd, nil, a, b) }

// GeluTanh returns the tanh approximation of GELU (abi.OpGeluTanh).
func GeluTanh(x Tensor) Tensor { return op(abi.OpGeluTanh, nil, x) }

// LayerNorm normalises over the last dim, then scales by w and shifts by b
// (abi.OpLayerNorm). PyTorch's default eps is 1e-5.
func LayerNorm(x, w, b Tensor, eps float64) Tensor {
	return op(abi.OpLayerNorm, []float64{eps}, x, w, b)
}

// Sub returns a − b, broadcasting the smaller along leading dims
// (abi.OpSub).
func Sub(a, b Tensor) Tensor { return op(abi.OpSub, nil, a, b) }

// Mul returns a·b elementwise, broadcasting the smaller along leading
// dims (abi.OpMul).
func Mul(a, b Tensor) Tensor { return op(abi.OpMul, nil, a, b) }

// Div returns a/b elementwise, broadcasting the smaller along leading
// dims (abi.OpDiv).
func Div(a, b Tensor) Tensor { return op(abi.OpDiv, nil, a, b) }

// Scale returns s·x (abi.OpScale).
func Scale(x Tensor, s float64) Tensor { return op(abi.OpScale, []float64{s}, x) }

// AddScalar returns x + c (abi.OpAddScalar).
func AddScalar(x Tensor, c float64) Tensor { return op(abi.OpAddScalar, []float64{c}, x) }

// Relu returns max(x, 0) (abi.OpRelu).
func Relu(x Tensor) Tensor { return op(abi.OpRelu, nil, x) }

// Gelu returns the exact GELU, ½·x·(1 + erf(x/√2)), as PyTorch's default
// (abi.OpGelu).
func Gelu(x Tensor) Tensor { return op(abi.OpGelu, nil, x) }

// Tanh returns tanh(x) (abi.OpTanh).
func Tanh(x Tensor) Tensor { return op(abi.OpTanh, nil, x) }

// Sigmoid returns 1/(1 + e^−x) (abi.OpSigmoid).
func Sigmoid(x Tensor) Tensor { return op(abi.OpSigmoid, nil, x) }

// Silu returns x·sigmoid(x) (abi.OpSilu).
func Silu(x Tensor) Tensor { return op(abi.OpSilu, nil, x) }

// Exp returns e^x (abi.OpExp).
func Exp(x Tensor) Tensor { return op(abi.OpExp, nil, x) }

// Log returns the natural logarithm of x (abi.OpLog).
func Log(x Tensor) Tensor { return op(abi.OpLog, nil, x) }

// Sqrt returns √x (abi.OpSqrt).
func Sqrt(x Tensor) Tensor { return op(abi.OpSqrt, nil, x) }

// Neg returns −x (abi.OpNeg).
func Neg(x Tensor) Tensor { return op(abi.OpNeg, nil, x) }

// Softmax returns the softmax of x along axis; a negative axis counts
// from the end, so -1 is the last dim (abi.OpSoftmax).
func Softmax(x Tensor, axis int) Tensor {
	return op(abi.OpSoftmax, []float64{float64(axis)}, x)
}

// LogSoftmax returns log(softmax(x)) along axis, computed stably
// (abi.OpLogSoftmax).
func LogSoftmax(x Tensor, axis int) Tensor {
	return op(abi.OpLogSoftmax, []float64{float64(axis)}, x)
}

// RMSNorm returns x/√(mean(x²) + eps)·w over the last dim
// (abi.OpRMSNorm).
func RMSNorm(x, w Tensor, eps float64) Tensor {
	return op(abi.OpRMSNorm, []float64{eps}, x, w)
}

// Reshape returns x's elements, in row-major order, under the shape dims;
// at most one dim may be -1, which is inferred (abi.OpReshape).
func Reshape(x Tensor, dims ...int64) Tensor {
	return op(abi.OpReshape, f64s(dims), x)
}

// Permute reorders x's dims: result dim i is x's dim perm[i], as
// torch.permute (abi.OpPermute).
func Permute(x Tensor, perm ...int) Tensor {
	attrs := make([]float64, len(perm))
	for i, p := range perm {
		attrs[i] = float64(p)
	}
	return op(abi.OpPermute, attrs, x)
}

// Transpose swaps dims dim0 and dim1 of x, as torch.transpose; negative
// dims count from the end (abi.OpTranspose).
func Transpose(x Tensor, dim0, dim1 int) Tensor {
	return op(abi.OpTranspose, []float64{float64(dim0), float64(dim1)}, x)
}

// Concat joins 1 to 64 tensors along axis; their other dims must agree
// (abi.OpConcat).
func Concat(axis int, xs ...Tensor) Tensor {
	return op(abi.OpConcat, []float64{float64(axis)}, xs...)
}

// Slice returns x[start:end] along axis, with end exclusive and nothing
// clamped (abi.OpSlice).
func Slice(x Tensor, axis int, start, end int64) Tensor {
	return op(abi.OpSlice, []float64{float64(axis), float64(start), float64(end)}, x)
}

// Split cuts x along axis into consecutive sections of the given sizes,
// which must sum to the dim, as torch.split with a list of sizes
// (abi.OpSplit, run with the op_multi host function). It returns one
// Tensor per size; on error each of them carries the error.
func Split(x Tensor, axis int, sizes ...int64) []Tensor {
	attrs := append([]float64{float64(axis)}, f64s(sizes)...)
	return opMulti(abi.OpSplit, len(sizes), attrs, x)
}

// Sum returns the sum of x along axis, keeping the axis as a dim of 1 if
// keepdim (abi.OpSum).
func Sum(x Tensor, axis int, keepdim bool) Tensor {
	return op(abi.OpSum, []float64{float64(axis), b2f(keepdim)}, x)
}

// Mean returns the mean of x along axis, keeping the axis as a dim of 1
// if keepdim (abi.OpMean).
func Mean(x Tensor, axis int, keepdim bool) Tensor {
	return op(abi.OpMean, []float64{float64(axis), b2f(keepdim)}, x)
}

// Max returns the maximum of x along axis, keeping the axis as a dim of 1
// if keepdim; the gradient goes to the first maximum (abi.OpMax).
func Max(x Tensor, axis int, keepdim bool) Tensor {
	return op(abi.OpMax, []float64{float64(axis), b2f(keepdim)}, x)
}

// Dropout returns x·mask/keepProb, hivemind's deterministic dropout: the
// float32 mask (usually 0|1, x's shape or a suffix of it) is an input, so
// that forward and backward drop the same units; an int64 or bool mask
// goes through Cast first. The gradient flows to x only (abi.OpDropout).
func Dropout(x, mask Tensor, keepProb float64) Tensor {
	return op(abi.OpDropout, []float64{keepProb}, x, mask)
}

// Embedding returns the rows of table [V, D] selected by ids (int32 or
// int64, any shape), shaped [ids..., D] (abi.OpEmbedding).
func Embedding(ids, table Tensor) Tensor { return op(abi.OpEmbedding, nil, ids, table) }

// Reduction says how CrossEntropy reduces the per-row losses.
type Reduction int

// Reductions, as torch.nn.functional.cross_entropy's reduction argument.
const (
	ReduceNone Reduction = 0 // one loss per row, [N]
	ReduceMean Reduction = 1 // the mean over rows not ignored, [1]
	ReduceSum  Reduction = 2 // the sum over rows, [1]
)

// DefaultIgnoreIndex is torch.nn.functional.cross_entropy's default
// ignore_index.
const DefaultIgnoreIndex = -100

// CrossEntropy returns the softmax cross-entropy of logits [N, C] against
// class targets [N] (int32 or int64), as
// torch.nn.functional.cross_entropy. Rows whose target is ignoreIndex
// (usually DefaultIgnoreIndex) give no loss and no gradient
// (abi.OpCrossEntropy).
func CrossEntropy(logits, targets Tensor, r Reduction, ignoreIndex int64) Tensor {
	return op(abi.OpCrossEntropy, []float64{float64(r), float64(ignoreIndex)}, logits, targets)
}

// BatchMatMul returns a matmul per batch of the leading dims,
// op(a)·op(b) for a [..., M, K] and b [..., K, N]; the leading dims of one
// may be a suffix of the other's (abi.OpBatchMatMul).
func BatchMatMul(a, b Tensor, transposeA, transposeB bool) Tensor {
	return op(abi.OpBatchMatMul, []float64{b2f(transposeA), b2f(transposeB)}, a, b)
}

// Attention returns fused scaled-dot-product attention,
// softmax(q·kᵀ·scale + masks)·v, for q [B,H,Tq,D], k [B,H,Tk,D] and
// v [B,H,Tk,Dv] (abi.OpAttention). keyPaddingMask is a bool [B,Tk]
// tensor whose true entries mark padding keys to ignore, as PyTorch's
// key_padding_mask, or a zero Tensor{} for none. causal masks the keys
// after each query. scale 0 means 1/√D. A query whose keys are all masked
// gets zeros.
func Attention(q, k, v, keyPaddingMask Tensor, causal bool, scale float64) Tensor {
	attrs := []float64{b2f(causal), scale}
	if isNone(keyPaddingMask) {
		return op(abi.OpAttention, attrs, q, k, v)
	}
	return op(abi.OpAttention, attrs, q, k, v, keyPaddingMask)
}

// LinearGeluTanh returns gelu_tanh(x·wᵀ + b), Linear then GeluTanh as one
// op that the host can fuse (abi.OpLinearGeluTanh). Pass a zero Tensor{}
// as b for no bias. On a host that lacks the op it runs the two.
func LinearGeluTanh(x, w, b Tensor) Tensor {
	return fused(abi.OpLinearGeluTanh, nil, []Tensor{x, w, b}, func() Tensor { return GeluTanh(Linear(x, w, b)) })
}

// AddLayerNorm returns LayerNorm(x + r, w, b, eps), Add then LayerNorm as
// one op that the host can fuse (abi.OpAddLayerNorm): the residual block
// of a post-norm transformer. On a host that lacks the op it runs the two.
func AddLayerNorm(x, r, w, b Tensor, eps float64) Tensor {
	return fused(abi.OpAddLayerNorm, []float64{eps}, []Tensor{x, r, w, b}, func() Tensor { return LayerNorm(Add(x, r), w, b, eps) })
}

// Cast returns x (float32, int32, int64 or bool) as float32, as torch's
// x.float(): integers rounded to nearest, a bool 0 or 1. It lets an
// expert compute with an integer or bool input, such as hivemind's int64
// dropout mask; only a float32 x gets a gradient (abi.OpCast).
func Cast(x Tensor) Tensor { return op(abi.OpCast, nil, x) }

// hostLacks records the fused ops that the host answered with
// ErrUnknownOp (a host older than the op), so that they run as their
// parts from then on without asking again. A guest instance is single
// threaded.
var hostLacks = map[abi.Op]bool{}

// fused runs the fused op code on args (a trailing zero Tensor{} is left
// out), or parts when the host lacks it.
func fused(code abi.Op, attrs []float64, args []Tensor, parts func() Tensor) Tensor {
	if !hostLacks[code] {
		if isNone(args[len(args)-1]) {
			args = args[:len(args)-1]
		}
		t := op(code, attrs, args...)
		var he *HostError
		if !errors.As(t.err, &he) || he.Errno != abi.ErrUnknownOp {
			return t
		}
		hostLacks[code] = true
	}
	return parts()
}

func f64s(v []int64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
