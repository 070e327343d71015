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

// handles checks args and returns their handles, or the first error one
// of them carries.
func handles(fn string, args []Tensor, buf []int32) ([]int32, error) {
	if len(args) > 64 {
		return nil, &HostError{Func: fn, Errno: abi.ErrInvalidArgument, Msg: "more than 64 args"}
	}
	hs := buf[:0]
	for _, a := range args {
		if a.err != nil {
			return nil, a.err
		}
		hs = append(hs, a.h)
	}
	return hs, nil
}

// op runs a single-result op on the host.
// callOp is the host's op function; the tests replace it.
var callOp = hostOp

func op(code abi.Op, attrs []float64, args ...Tensor) Tensor {
	var buf [8]int32
	hs, err := handles(abi.FuncOp, args, buf[:])
	if err != nil {
		return Tensor{err: err}
	}
	h, err := check(abi.FuncOp, callOp(int32(code), ptrI32(hs), uint32(len(hs)), ptrF64(attrs), uint32(len(attrs))))
	if err != nil {
		return Tensor{err: err}
	}
	return Tensor{h: h}
}

// opMulti runs an op with n results on the host. On error every result
// carries it.
func opMulti(code abi.Op, n int, attrs []float64, args ...Tensor) []Tensor {
	out := make([]Tensor, n)
	fail := func(err error) []Tensor {
		for i := range out {
			out[i] = Tensor{err: err}
		}
		return out
	}
	var buf [8]int32
	hs, err := handles(abi.FuncOpMulti, args, buf[:])
	if err != nil {
		return fail(err)
	}
	res := make([]int32, n)
	got, err := check(abi.FuncOpMulti, hostOpMulti(int32(code), ptrI32(hs), uint32(len(hs)), ptrF64(attrs), uint32(len(attrs)), ptrI32(res), uint32(n)))
	if err != nil {
		return fail(err)
	}
	if int(got) != n {
		return fail(&HostError{Func: abi.FuncOpMulti, Errno: abi.ErrInternal, Msg: "unexpected number of results"})
	}
	for i, h := range res {
		out[i] = Tensor{h: h}
	}
	return out
}
