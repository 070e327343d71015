package abi

// Op is the code of an op run with FuncOp. Each constant documents its args
// (tensor handles, in order) and attrs (f64 values, in order; trailing
// attrs with a default may be left out). The compute dtype is float32.
//
// # Broadcasting
//
// Binary elementwise ops broadcast along leading dimensions only: the shape
// of the smaller operand must equal a suffix of the larger's shape, and it is
// repeated over the larger's leading dimensions. [B,T,H] + [H] and
// [B,T,H] + [T,H] are allowed; [B,T,H] + [B,1,H] is not.
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
	//	attrs: eps (default 1e-5)
	//	result: shape of x
	OpLayerNorm Op = 5
)

// String returns the op's name.
func (o Op) String() string {
	switch o {
	case OpMatMul:
		return "matmul"
	case OpLinear:
		return "linear"
	case OpAdd:
		return "add"
	case OpGeluTanh:
		return "gelu_tanh"
	case OpLayerNorm:
		return "layer_norm"
	}
	return "unknown"
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
