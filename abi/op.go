package abi

import "strconv"

// Op is the code of an op run with FuncOp. Each constant documents its args
// (tensor handles, in order) and attrs (f64 values, in order; trailing
// attrs with a default may be left out). The compute dtype is float32.
//
// # Broadcasting
//
// Binary elementwise ops (add, sub, mul, div) broadcast along leading
// dimensions only: the shape of the smaller operand must equal a suffix of
// the larger's shape, and it is repeated over the larger's leading
// dimensions. Either operand may be the smaller. [B,T,H] + [H] and
// [B,T,H] + [T,H] are allowed; [B,T,H] + [B,1,H] is not. Dropout's mask and
// the leading (batch) dims of batch_matmul follow the same rule.
//
// # Attrs
//
// Attrs are f64. An attr that is a flag must be exactly 0 or 1; one that
// is a count, a dim, an axis or an index must be an integer in range (an
// axis in [−rank, rank), negative counting from the end); NaN and ±Inf are
// refused wherever a finite number is needed. A bad attr is
// ErrInvalidArgument, a shape that does not fit ErrShapeMismatch.
//
// # Dtypes
//
// Every tensor arg is float32, except the ids of OpEmbedding and the
// targets of OpCrossEntropy (int32 or int64), the key padding mask of
// OpAttention (bool) and the x of OpCast (float32, int32, int64 or
// bool). Results are float32.
type Op int32

// Ops of ABI v1.
const (
	// OpMatMul: C = op(A)·op(B) for 2-D A and B, where op transposes
	// when its flag is set.
	//	args:  A [M,K] (or [K,M] if transpose_a), B [K,N] (or [N,K] if transpose_b)
	//	attrs: transpose_a (0|1, default 0), transpose_b (0|1, default 0)
	//	result: [M,N]
	OpMatMul Op = 1

	// OpLinear: y = x·Wᵀ + b, as torch.nn.functional.linear. x may have
	// any rank >= 1; its last dim is the input features.
	//	args:  x [..., in], W [out, in], b [out] (optional)
	//	attrs: none
	//	result: [..., out]
	OpLinear Op = 2

	// OpAdd: a + b with leading-dimension broadcasting.
	//	args:  a, b
	//	result: the larger shape
	OpAdd Op = 3

	// OpGeluTanh: the GELU activation with the tanh approximation,
	// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
	//	args:  x
	//	result: shape of x
	OpGeluTanh Op = 4

	// OpLayerNorm: layer normalisation over the last dimension,
	// (x − mean)/√(var + eps)·w + b, with the biased variance.
	//	args:  x [..., H], w [H], b [H]
	//	attrs: eps (finite, >= 0, default 1e-5)
	//	result: shape of x
	OpLayerNorm Op = 5

	// OpSub: a − b with leading-dimension broadcasting (either side may
	// be the smaller).
	//	args:  a, b
	//	result: the larger shape
	OpSub Op = 6

	// OpMul: a·b, elementwise, with leading-dimension broadcasting.
	//	args:  a, b
	//	result: the larger shape
	OpMul Op = 7

	// OpDiv: a/b, elementwise, with leading-dimension broadcasting.
	// Division by zero follows IEEE 754 (±Inf or NaN).
	//	args:  a, b
	//	result: the larger shape
	OpDiv Op = 8

	// OpScale: s·x.
	//	args:  x
	//	attrs: s (default 1)
	//	result: shape of x
	OpScale Op = 9

	// OpAddScalar: x + c.
	//	args:  x
	//	attrs: c (default 0)
	//	result: shape of x
	OpAddScalar Op = 10

	// OpRelu: max(x, 0); the gradient at 0 is 0.
	//	args:  x
	//	result: shape of x
	OpRelu Op = 11

	// OpGelu: the exact GELU, x·Φ(x) = ½·x·(1 + erf(x/√2)), as
	// torch.nn.functional.gelu with approximate="none".
	//	args:  x
	//	result: shape of x
	OpGelu Op = 12

	// OpTanh: tanh(x).
	//	args:  x
	//	result: shape of x
	OpTanh Op = 13

	// OpSigmoid: 1/(1 + e^−x).
	//	args:  x
	//	result: shape of x
	OpSigmoid Op = 14

	// OpSilu: x·sigmoid(x) (also called swish).
	//	args:  x
	//	result: shape of x
	OpSilu Op = 15

	// OpExp: e^x.
	//	args:  x
	//	result: shape of x
	OpExp Op = 16

	// OpLog: the natural logarithm; log(0) = −Inf and log(x<0) = NaN.
	//	args:  x
	//	result: shape of x
	OpLog Op = 17

	// OpSqrt: √x; √(x<0) = NaN.
	//	args:  x
	//	result: shape of x
	OpSqrt Op = 18

	// OpNeg: −x.
	//	args:  x
	//	result: shape of x
	OpNeg Op = 19

	// OpSoftmax: softmax along one axis, computed with the row maximum
	// subtracted so that large inputs do not overflow.
	//	args:  x (rank >= 1)
	//	attrs: axis (default -1; a negative axis counts from the end)
	//	result: shape of x
	OpSoftmax Op = 20

	// OpLogSoftmax: log(softmax(x)) along one axis, computed as
	// x − max − log Σ e^(x−max).
	//	args:  x (rank >= 1)
	//	attrs: axis (default -1; a negative axis counts from the end)
	//	result: shape of x
	OpLogSoftmax Op = 21

	// OpRMSNorm: root-mean-square normalisation over the last dimension,
	// x/√(mean(x²) + eps)·w.
	//	args:  x [..., H], w [H]
	//	attrs: eps (finite, >= 0, default 1e-6)
	//	result: shape of x
	OpRMSNorm Op = 22

	// OpReshape: the same elements in row-major order under a new shape.
	// At most one dim may be -1, which is inferred; the element count
	// must not change. No attrs gives a scalar (for a one-element x).
	//	args:  x
	//	attrs: the new dims (at most MaxRank)
	//	result: the new shape
	OpReshape Op = 23

	// OpPermute: reorders the dims; result dim i is x's dim perm[i], as
	// torch.permute. Negative entries count from the end.
	//	args:  x
	//	attrs: perm, a permutation of 0..rank−1 (exactly rank attrs)
	//	result: x's dims permuted
	OpPermute Op = 24

	// OpTranspose: swaps two dims, as torch.transpose. Negative dims
	// count from the end.
	//	args:  x (rank >= 1)
	//	attrs: dim0, dim1 (both required)
	//	result: x's shape with dim0 and dim1 swapped
	OpTranspose Op = 25

	// OpConcat: joins tensors along one axis; all other dims must agree.
	//	args:  x0, x1, … (1 to 64 tensors of the same rank >= 1)
	//	attrs: axis (default 0; negative counts from the end)
	//	result: the shared shape with the axis dims summed
	OpConcat Op = 26

	// OpSlice: x[start:end] along one axis. end is exclusive, and nothing
	// is clamped: 0 <= start < end <= dim, or the op fails. Negative
	// start or end do not count from the end.
	//	args:  x (rank >= 1)
	//	attrs: axis, start, end (all required; axis may be negative)
	//	result: x's shape with the axis dim end − start
	OpSlice Op = 27

	// OpSplit: cuts x along one axis into consecutive sections of the
	// given sizes, which must be positive and sum to the dim. It is the
	// one op of v1 with several results, one per section.
	//	args:  x (rank >= 1)
	//	attrs: axis, size0, size1, … (1 to 63 sizes)
	//	results: one per size, x's shape with the axis dim that size
	OpSplit Op = 28

	// OpSum: the sum along one axis.
	//	args:  x (rank >= 1)
	//	attrs: axis (default -1), keepdim (0|1, default 0)
	//	result: x's shape without the axis, or with it 1 if keepdim
	OpSum Op = 29

	// OpMean: the mean along one axis.
	//	args:  x (rank >= 1)
	//	attrs: axis (default -1), keepdim (0|1, default 0)
	//	result: as OpSum
	OpMean Op = 30

	// OpMax: the maximum along one axis. Its gradient goes to the first
	// position that holds the maximum. NaN propagates.
	//	args:  x (rank >= 1)
	//	attrs: axis (default -1), keepdim (0|1, default 0)
	//	result: as OpSum
	OpMax Op = 31

	// OpDropout: dropout with the mask as an input (hivemind's
	// DeterministicDropout), x·mask/keep_prob, so that forward and
	// backward use the same mask. The gradient flows to x only.
	//	args:  x, mask (float32, usually 0|1; x's shape or a suffix of it)
	//	attrs: keep_prob (0 < keep_prob <= 1, default 1)
	//	result: shape of x
	OpDropout Op = 32

	// OpEmbedding: rows of table selected by ids. An id outside [0, V)
	// is ErrInvalidArgument. The gradient scatters into table; ids get
	// none.
	//	args:  ids (int32 or int64, rank < MaxRank), table [V, D]
	//	result: [ids..., D]
	OpEmbedding Op = 33

	// OpCrossEntropy: the softmax cross-entropy of logits against class
	// targets, as torch.nn.functional.cross_entropy. Rows whose target
	// is ignore_index give 0 loss and no gradient and are left out of
	// the mean (a mean over no rows is NaN, as in torch); any other
	// target outside [0, C) is ErrInvalidArgument.
	//	args:  logits [N, C], targets (int32 or int64) [N]
	//	attrs: reduction (0 none, 1 mean, 2 sum; default 0),
	//	       ignore_index (default -100)
	//	result: [N] for none, [1] for mean and sum
	OpCrossEntropy Op = 34

	// OpBatchMatMul: a matmul per batch of the leading dims. The leading
	// dims of a and b are equal, or those of one are a suffix of the
	// other's and it is repeated over the rest (as for elementwise
	// broadcasting).
	//	args:  a [..., M, K] (or [..., K, M] if transpose_a),
	//	       b [..., K, N] (or [..., N, K] if transpose_b)
	//	attrs: transpose_a (0|1, default 0), transpose_b (0|1, default 0)
	//	result: [(the longer leading dims)..., M, N]
	OpBatchMatMul Op = 35

	// OpAttention: fused scaled-dot-product attention,
	// softmax(q·kᵀ·scale + masks)·v, with -Inf at masked positions. A
	// query row whose keys are all masked gives zeros, not NaN.
	//	args:  q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,Dv],
	//	       key_padding_mask (optional, bool [B,Tk]; true marks a padding
	//	       key that is ignored, as PyTorch's key_padding_mask)
	//	attrs: causal (0|1, default 0; masks key j for query i when
	//	       j > i + Tk − Tq), scale (default 1/√D; 0 means the default)
	//	result: [B,H,Tq,Dv]
	OpAttention Op = 36

	// OpLinearGeluTanh: y = gelu_tanh(x·Wᵀ + b), OpLinear followed by
	// OpGeluTanh as one op, so that the host can apply the bias and the
	// activation to each block of the product while it is in cache. The
	// result and the gradients are those of the two ops.
	//	args:  x [..., in], W [out, in], b [out] (optional)
	//	attrs: none
	//	result: [..., out]
	OpLinearGeluTanh Op = 37

	// OpAddLayerNorm: layer_norm(x + r) over the last dimension, OpAdd
	// followed by OpLayerNorm as one op (the residual block of a post-norm
	// transformer), so that the sum never makes a round trip through
	// memory. x and r broadcast as for OpAdd; the sum is not a result
	// (use the two ops when it is needed). Gradients flow to x, r, w and
	// b as through the two ops.
	//	args:  x, r (one shape a suffix of the other; the larger [..., H]),
	//	       w [H], b [H]
	//	attrs: eps (finite, >= 0, default 1e-5)
	//	result: the larger shape
	OpAddLayerNorm Op = 38

	// OpCast: x converted to float32, as torch's x.to(torch.float32),
	// so that an expert can compute with the integer and bool inputs
	// that hivemind's experts declare (det_dropout's int64 mask). An
	// int32 or int64 is rounded to the nearest float32 (ties to even),
	// a bool is 0 for false and 1 for true (any nonzero byte is true),
	// and a float32 is copied. The gradient flows through a float32 x;
	// an integer or bool x gets none.
	//	args:  x (float32, int32, int64 or bool)
	//	attrs: dtype (the abi.DType of the result; DTypeFloat32, the
	//	       default, is the only one of v1)
	//	result: shape of x
	OpCast Op = 39
)

// opNames holds each op's name, indexed by its code.
var opNames = [...]string{
	1:  "matmul",
	2:  "linear",
	3:  "add",
	4:  "gelu_tanh",
	5:  "layer_norm",
	6:  "sub",
	7:  "mul",
	8:  "div",
	9:  "scale",
	10: "add_scalar",
	11: "relu",
	12: "gelu",
	13: "tanh",
	14: "sigmoid",
	15: "silu",
	16: "exp",
	17: "log",
	18: "sqrt",
	19: "neg",
	20: "softmax",
	21: "log_softmax",
	22: "rms_norm",
	23: "reshape",
	24: "permute",
	25: "transpose",
	26: "concat",
	27: "slice",
	28: "split",
	29: "sum",
	30: "mean",
	31: "max",
	32: "dropout",
	33: "embedding",
	34: "cross_entropy",
	35: "batch_matmul",
	36: "attention",
	37: "linear_gelu_tanh",
	38: "add_layer_norm",
	39: "cast",
}

// Ops returns every op of ABI v1, in code order. The slice is new, so a
// caller may keep or change it.
func Ops() []Op {
	ops := make([]Op, 0, len(opNames)-1)
	for o := range opNames[1:] {
		ops = append(ops, Op(o+1))
	}
	return ops
}

// Valid reports whether o is an op of ABI v1.
func (o Op) Valid() bool { return o > 0 && int(o) < len(opNames) }

// String returns the op's name, as snake_case, or "op(N)" for an unknown
// code.
func (o Op) String() string {
	if o.Valid() {
		return opNames[o]
	}
	return "op(" + strconv.Itoa(int(o)) + ")"
}

// Init is how the host fills a new parameter (FuncParamNew's init).
type Init int32

// Initialisers. a and b are FuncParamNew's f64 arguments.
const (
	InitZeros   Init = 1 // all zeros; a and b unused
	InitOnes    Init = 2 // all ones; a and b unused
	InitUniform Init = 3 // uniform on [a, b)
	InitNormal  Init = 4 // normal with mean a and standard deviation b
)
