// Command det_dropout is hivemind's "det_dropout" expert
// (DeterministicDropoutNetwork with dropout_prob 0.2) as a moehost Wasm
// module:
//
//	y = linear_out(relu(linear_in(x·mask/0.8)))
//
// with linear_in: h→2h and linear_out: 2h→h. The dropout mask is an input,
// so that the caller picks it and forward and backward drop the same units.
// It is declared as hivemind's server declares it, int64 of x's shape
// (its sample input is torch.randint), so that an unmodified hivemind
// client's mask is taken as sent; like torch's x·mask, any int64 value is
// used as its float32 (0 and 1 in practice). It gets no gradient: a
// backward returns int64 zeros for it, as hivemind's does. The hidden size
// h comes from the config key "hidden_dim" (default 1024).
//
// Build with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o det_dropout.wasm .
package main

import "github.com/moehost/moehost/sdk/expert"

// keepProb is 1 − hivemind's dropout_prob.
const keepProb = 0.8

type detDropout struct {
	linearIn, linearOut expert.LinearLayer
}

func (d *detDropout) Init(c *expert.InitContext) error {
	h, err := c.ConfigInt("hidden_dim")
	if err != nil {
		h = 1024
	}
	if h <= 0 {
		return expert.Fail("det_dropout: hidden_dim must be positive")
	}
	if err := c.Input("x", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	if err := c.Input("mask", expert.Int64, expert.Batch, h); err != nil {
		return err
	}
	if err := c.Output("y", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	d.linearIn = expert.NewLinear(c, "linear_in", h, 2*h)
	d.linearOut = expert.NewLinear(c, "linear_out", 2*h, h)
	if err := d.linearIn.Err(); err != nil {
		return err
	}
	return d.linearOut.Err()
}

func (d *detDropout) Forward(c *expert.Call) error {
	x := expert.Dropout(c.Input(0), expert.Cast(c.Input(1)), keepProb)
	return c.SetOutput(0, d.linearOut.Forward(expert.Relu(d.linearIn.Forward(x))))
}

func init() { expert.Register(&detDropout{}) }

// main is not run in a c-shared module; the host calls the exports.
func main() {}
