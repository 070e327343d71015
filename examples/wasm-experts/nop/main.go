// Command nop is hivemind's "nop" expert (NopExpert) as a moehost Wasm
// module: the identity, y = x, on x [batch, hidden_dim]. The hidden size
// comes from the config key "hidden_dim" (default 1024). It has no
// parameters; its gradient is the output gradient.
//
// Build with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o nop.wasm .
package main

import "github.com/moehost/moehost/sdk/expert"

type nop struct{}

func (nop) Init(c *expert.InitContext) error {
	h, err := c.ConfigInt("hidden_dim")
	if err != nil {
		h = 1024
	}
	if h <= 0 {
		return expert.Fail("nop: hidden_dim must be positive")
	}
	if err := c.Input("x", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	return c.Output("y", expert.Float32, expert.Batch, h)
}

// Forward sets the output to the input handle itself: no op, no copy.
func (nop) Forward(c *expert.Call) error { return c.SetOutput(0, c.Input(0)) }

func init() { expert.Register(nop{}) }

// main is not run in a c-shared module; the host calls the exports.
func main() {}
