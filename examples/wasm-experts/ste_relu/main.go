// Command ste_relu is an expert with a hand-written backward:
//
//	y = relu(x)·s
//
// with a learned scale s [h] (ones at first). Its Backward is a
// straight-through estimator: the gradient passes relu as if it were the
// identity, grad_x = grad_y·s, which autograd would zero where x < 0; the
// scale gets grad_s = Σ_batch grad_y·relu(x). Importing package
// custombackward makes the host call Backward instead of its tape.
//
// Build with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ste_relu.wasm .
package main

import (
	"github.com/moehost/moehost/sdk/expert"
	_ "github.com/moehost/moehost/sdk/expert/custombackward"
)

type steReLU struct {
	scale expert.Tensor
}

func (e *steReLU) Init(c *expert.InitContext) error {
	h, err := c.ConfigInt("hidden_dim")
	if err != nil {
		h = 1024
	}
	if err := c.Input("x", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	if err := c.Output("y", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	e.scale = c.Param("scale", expert.Ones(), h)
	return e.scale.Err()
}

func (e *steReLU) Forward(c *expert.Call) error {
	return c.SetOutput(0, expert.Mul(expert.Relu(c.Input(0)), e.scale))
}

func (e *steReLU) Backward(c *expert.BackwardCall) error {
	x, gy := c.Input(0), c.GradOutput(0)
	if err := c.SetParamGrad(e.scale, expert.Sum(expert.Mul(gy, expert.Relu(x)), 0, false)); err != nil {
		return err
	}
	return c.SetGradInput(0, expert.Mul(gy, e.scale))
}

func init() { expert.Register(&steReLU{}) }

// main is not run in a c-shared module; the host calls the exports.
func main() {}
