// Command transformer is hivemind's "transformer" expert
// (TransformerEncoderLayer with nhead 16 and dim_feedforward 4h, as
// torch.nn.TransformerEncoderLayer in eval mode with a GELU) as a moehost
// Wasm module:
//
//	a = x + self_attn(x, key_padding_mask)
//	b = norm1(a)
//	y = norm2(b + linear2(gelu(linear1(b))))
//
// on x [batch, seq_len, h] and the key padding mask [batch, seq_len]
// (bool, true at padding positions, as PyTorch's src_key_padding_mask).
// The attention is torch.nn.MultiheadAttention's, with its parameter
// layout; gelu is the exact (erf) form; both LayerNorms use eps 1e-5. The
// parameters are named as in the PyTorch state_dict (self_attn.in_proj_weight,
// linear1.weight, norm1.weight, …). Config keys: "hidden_dim" (default
// 1024), "seq_len" (default 128) and "num_heads" (default 16), which must
// divide hidden_dim.
//
// Build with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o transformer.wasm .
package main

import "github.com/moehost/moehost/sdk/expert"

type transformer struct {
	selfAttn         expert.MultiheadAttentionLayer
	linear1, linear2 expert.LinearLayer
	norm1, norm2     expert.LayerNormLayer
}

// config reads an integer config value, or def when it is not set.
func config(c *expert.InitContext, key string, def int64) int64 {
	if v, err := c.ConfigInt(key); err == nil {
		return v
	}
	return def
}

func (m *transformer) Init(c *expert.InitContext) error {
	h := config(c, "hidden_dim", 1024)
	t := config(c, "seq_len", 128)
	heads := config(c, "num_heads", 16)
	if h <= 0 || t <= 0 || heads <= 0 || h%heads != 0 {
		return expert.Fail("transformer: hidden_dim, seq_len and num_heads must be positive, and num_heads must divide hidden_dim")
	}
	if err := c.Input("x", expert.Float32, expert.Batch, t, h); err != nil {
		return err
	}
	if err := c.Input("key_padding_mask", expert.Bool, expert.Batch, t); err != nil {
		return err
	}
	if err := c.Output("y", expert.Float32, expert.Batch, t, h); err != nil {
		return err
	}
	// Declared in the order of PyTorch's state_dict.
	m.selfAttn = expert.NewMultiheadAttention(c, "self_attn", h, heads)
	m.linear1 = expert.NewLinear(c, "linear1", h, 4*h)
	m.linear2 = expert.NewLinear(c, "linear2", 4*h, h)
	m.norm1 = expert.NewLayerNorm(c, "norm1", h, 1e-5)
	m.norm2 = expert.NewLayerNorm(c, "norm2", h, 1e-5)
	for _, err := range []error{m.selfAttn.Err(), m.linear1.Err(), m.linear2.Err(), m.norm1.Err(), m.norm2.Err()} {
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *transformer) Forward(c *expert.Call) error {
	x, mask := c.Input(0), c.Input(1)
	x = m.norm1.ForwardAdd(x, m.selfAttn.Forward(x, mask, false))
	ff := m.linear2.Forward(expert.Gelu(m.linear1.Forward(x)))
	return c.SetOutput(0, m.norm2.ForwardAdd(x, ff))
}

func init() { expert.Register(&transformer{}) }

// main is not run in a c-shared module; the host calls the exports.
func main() {}
