package expert

import (
	"github.com/moehost/moehost/abi"
)

// InitContext declares the expert during Init.
type InitContext struct{}

// ConfigInt returns the integer config value key, such as "hidden_dim".
func (*InitContext) ConfigInt(key string) (int64, error) {
	var v [1]int64
	p, n := strPtr(key)
	_, err := check(abi.FuncConfigI64, hostConfigI64(p, n, ptr64(v[:])))
	return v[0], err
}

// Input declares the next input. Use Batch as the first dim.
func (*InitContext) Input(name string, dt DType, shape ...int64) error {
	p, n := strPtr(name)
	_, err := check(abi.FuncDeclareInput, hostDeclareInput(p, n, int32(dt), ptr64(shape), uint32(len(shape))))
	return err
}

// Output declares the next output. Use Batch as the first dim.
func (*InitContext) Output(name string, dt DType, shape ...int64) error {
	p, n := strPtr(name)
	_, err := check(abi.FuncDeclareOutput, hostDeclareOutput(p, n, int32(dt), ptr64(shape), uint32(len(shape))))
	return err
}

// Init says how the host fills a new parameter.
type Init struct {
	kind abi.Init
	a, b float64
}

// Zeros fills with 0.
func Zeros() Init { return Init{kind: abi.InitZeros} }

// Ones fills with 1.
func Ones() Init { return Init{kind: abi.InitOnes} }

// Uniform draws from [lo, hi).
func Uniform(lo, hi float64) Init { return Init{kind: abi.InitUniform, a: lo, b: hi} }

// Normal draws from a normal distribution.
func Normal(mean, std float64) Init { return Init{kind: abi.InitNormal, a: mean, b: std} }

// Param declares a float32 parameter. The host owns and trains it; the
// returned Tensor is valid for the instance's life.
func (*InitContext) Param(name string, init Init, shape ...int64) Tensor {
	p, n := strPtr(name)
	h, err := check(abi.FuncParamNew, hostParamNew(p, n, int32(abi.DTypeFloat32), ptr64(shape), uint32(len(shape)), int32(init.kind), init.a, init.b))
	if err != nil {
		return Tensor{err: err}
	}
	return Tensor{h: h}
}

// Call is one Forward call of a batch.
type Call struct{}

// Input returns the batched input with index i.
func (*Call) Input(i int) Tensor {
	h, err := check(abi.FuncInput, hostInput(int32(i)))
	if err != nil {
		return Tensor{err: err}
	}
	return Tensor{h: h}
}

// SetOutput sets output i to t, or returns the error t carries.
func (*Call) SetOutput(i int, t Tensor) error {
	if t.err != nil {
		return t.err
	}
	_, err := check(abi.FuncOutput, hostOutput(int32(i), t.h))
	return err
}

// Fail reports a message of the expert's own to the caller; return the
// result from Forward or Init.
func Fail(msg string) error {
	p, n := strPtr(msg)
	hostFail(p, n)
	return &HostError{Func: abi.FuncFail, Errno: abi.ErrInvalidArgument, Msg: msg}
}
