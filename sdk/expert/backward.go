package expert

import "github.com/moehost/moehost/abi"

// Backwarder is an Expert with a hand-written backward, which the host
// calls instead of differentiating Forward on its tape. The module must
// also import package custombackward, which exports moe_backward:
//
//	import _ "github.com/moehost/moehost/sdk/expert/custombackward"
//
// Backward reads the inputs and the gradients of the outputs, and sets the
// gradient of every float32 input; parameters it gives no gradient get
// zero. Its ops are not recorded.
type Backwarder interface {
	Expert
	Backward(c *BackwardCall) error
}

// BackwardCall is one Backward call of a batch.
type BackwardCall struct{}

// Input returns the batched input with index i.
func (*BackwardCall) Input(i int) Tensor { return (&Call{}).Input(i) }

// GradOutput returns the gradient of output i.
func (*BackwardCall) GradOutput(i int) Tensor {
	h, err := check(abi.FuncGradOutput, hostGradOutput(int32(i)))
	if err != nil {
		return Tensor{err: err}
	}
	return Tensor{h: h}
}

// SetGradInput sets the gradient of input i to g, or returns the error g
// carries.
func (*BackwardCall) SetGradInput(i int, g Tensor) error {
	if g.err != nil {
		return g.err
	}
	_, err := check(abi.FuncGradInput, hostGradInput(int32(i), g.h))
	return err
}

// SetParamGrad gives the gradient g of the parameter p (a Tensor from
// InitContext.Param).
func (*BackwardCall) SetParamGrad(p, g Tensor) error {
	if err := firstErr(p, g); err != nil {
		return err
	}
	_, err := check(abi.FuncParamGrad, hostParamGrad(p.h, g.h))
	return err
}
