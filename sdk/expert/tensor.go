package expert

import (
	"github.com/moehost/moehost/abi"
)

// Tensor is a handle to a tensor on the host. An op on a Tensor that
// carries an error returns that error without calling the host, so a
// Forward can chain ops and check once, when it sets an output (as
// bufio.Scanner does).
type Tensor struct {
	h   int32
	err error
}

// Err returns the first error met while computing t.
func (t Tensor) Err() error { return t.err }

// Shape returns the tensor's dims.
func (t Tensor) Shape() ([]int64, error) {
	if t.err != nil {
		return nil, t.err
	}
	var dims [abi.MaxRank]int64
	r, err := check(abi.FuncTensorShape, hostTensorShape(t.h, ptr64(dims[:]), abi.MaxRank))
	if err != nil {
		return nil, err
	}
	return append([]int64(nil), dims[:r]...), nil
}

// Float32s copies a float32 tensor into guest memory.
func (t Tensor) Float32s() ([]float32, error) {
	shape, err := t.Shape()
	if err != nil {
		return nil, err
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	out := make([]float32, n)
	if n == 0 {
		return out, nil
	}
	_, err = check(abi.FuncTensorRead, hostTensorRead(t.h, ptr32(out), uint32(4*n)))
	return out, err
}

// FromFloat32s creates a call-lived tensor holding data with the given
// shape.
func FromFloat32s(shape []int64, data []float32) Tensor {
	h, err := check(abi.FuncTensorNew, hostTensorNew(int32(abi.DTypeFloat32), ptr64(shape), uint32(len(shape))))
	if err != nil {
		return Tensor{err: err}
	}
	if len(data) > 0 {
		if _, err := check(abi.FuncTensorWrite, hostTensorWrite(h, ptr32(data), uint32(4*len(data)))); err != nil {
			return Tensor{err: err}
		}
	} else if _, err := check(abi.FuncTensorWrite, hostTensorWrite(h, 0, 0)); err != nil {
		return Tensor{err: err}
	}
	return Tensor{h: h}
}

// op runs an op on the host.
func op(code abi.Op, attrs []float64, args ...Tensor) Tensor {
	var hs [8]int32
	if len(args) > len(hs) {
		return Tensor{err: &HostError{Func: abi.FuncOp, Errno: abi.ErrInvalidArgument, Msg: "too many args"}}
	}
	for i, a := range args {
		if a.err != nil {
			return a
		}
		hs[i] = a.h
	}
	h, err := check(abi.FuncOp, hostOp(int32(code), ptrI32(hs[:len(args)]), uint32(len(args)), ptrF64(attrs), uint32(len(attrs))))
	if err != nil {
		return Tensor{err: err}
	}
	return Tensor{h: h}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// MatMul returns op(a)·op(b) for 2-D tensors, transposing where asked.
func MatMul(a, b Tensor, transposeA, transposeB bool) Tensor {
	return op(abi.OpMatMul, []float64{b2f(transposeA), b2f(transposeB)}, a, b)
}

// Linear returns x·wᵀ + b, as torch.nn.functional.linear. Pass a zero
// Tensor{} as b for no bias.
func Linear(x, w, b Tensor) Tensor {
	if b == (Tensor{}) {
		return op(abi.OpLinear, nil, x, w)
	}
	return op(abi.OpLinear, nil, x, w, b)
}

// Add returns a + b, broadcasting the smaller along leading dims.
func Add(a, b Tensor) Tensor { return op(abi.OpAdd, nil, a, b) }

// GeluTanh returns the tanh approximation of GELU.
func GeluTanh(x Tensor) Tensor { return op(abi.OpGeluTanh, nil, x) }

// LayerNorm normalises over the last dim, then scales by w and shifts by b.
func LayerNorm(x, w, b Tensor, eps float64) Tensor {
	return op(abi.OpLayerNorm, []float64{eps}, x, w, b)
}
