// Command ffn is hivemind's "ffn" expert (FeedforwardBlock) as a moehost
// Wasm module:
//
//	y = LayerNorm(x + Linear2(gelu_tanh(Linear1(x))))
//
// with Linear1: h→4h, Linear2: 4h→h and LayerNorm eps 1e-12. The hidden
// size h comes from the expert's config key "hidden_dim" (default 1024).
//
// Build with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o ffn.wasm .
package main

import "github.com/moehost/moehost/sdk/expert"

type ffn struct {
	ffn, ffnOutput expert.LinearLayer
	norm           expert.LayerNormLayer
}

func (f *ffn) Init(c *expert.InitContext) error {
	h, err := c.ConfigInt("hidden_dim")
	if err != nil {
		h = 1024
	}
	if h <= 0 {
		return expert.Fail("ffn: hidden_dim must be positive")
	}
	if err := c.Input("x", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	if err := c.Output("y", expert.Float32, expert.Batch, h); err != nil {
		return err
	}
	f.ffn = expert.NewLinear(c, "ffn", h, 4*h)
	f.ffnOutput = expert.NewLinear(c, "ffn_output", 4*h, h)
	f.norm = expert.NewLayerNorm(c, "layer_norm", h, 1e-12)
	for _, err := range []error{f.ffn.Err(), f.ffnOutput.Err(), f.norm.Err()} {
		if err != nil {
			return err
		}
	}
	return nil
}

func (f *ffn) Forward(c *expert.Call) error {
	x := c.Input(0)
	// The fused ops: linear1's bias and gelu in the GEMM's epilogue, the
	// residual add in layer_norm's pass (on a host without them, the SDK
	// runs the parts).
	h := f.ffn.ForwardGeluTanh(x)
	return c.SetOutput(0, f.norm.ForwardAdd(x, f.ffnOutput.Forward(h)))
}

func init() { expert.Register(&ffn{}) }

// main is not run in a c-shared module; the host calls the exports.
func main() {}
