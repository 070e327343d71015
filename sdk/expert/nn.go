package expert

import (
	"math"

	"github.com/moehost/moehost/abi"
)

// LinearLayer is torch.nn.Linear: y = x·Wᵀ + b, with W [out, in].
type LinearLayer struct {
	W, B Tensor
}

// NewLinear declares the parameters name+".weight" and name+".bias",
// initialised as PyTorch does: both uniform on ±1/√in (kaiming_uniform
// with a=√5 reduces to that bound).
func NewLinear(c *InitContext, name string, in, out int64) LinearLayer {
	bound := 1 / math.Sqrt(float64(in))
	return LinearLayer{
		W: c.Param(name+".weight", Uniform(-bound, bound), out, in),
		B: c.Param(name+".bias", Uniform(-bound, bound), out),
	}
}

// Forward applies the layer.
func (l LinearLayer) Forward(x Tensor) Tensor { return Linear(x, l.W, l.B) }

// ForwardGeluTanh applies the layer and then gelu_tanh, as one fused op
// (LinearGeluTanh).
func (l LinearLayer) ForwardGeluTanh(x Tensor) Tensor { return LinearGeluTanh(x, l.W, l.B) }

// Err returns the first error met declaring the layer.
func (l LinearLayer) Err() error { return firstErr(l.W, l.B) }

// LayerNormLayer is torch.nn.LayerNorm over the last dim.
type LayerNormLayer struct {
	W, B Tensor
	Eps  float64
}

// NewLayerNorm declares name+".weight" (ones) and name+".bias" (zeros).
func NewLayerNorm(c *InitContext, name string, dim int64, eps float64) LayerNormLayer {
	return LayerNormLayer{
		W:   c.Param(name+".weight", Ones(), dim),
		B:   c.Param(name+".bias", Zeros(), dim),
		Eps: eps,
	}
}

// Forward applies the layer.
func (l LayerNormLayer) Forward(x Tensor) Tensor { return LayerNorm(x, l.W, l.B, l.Eps) }

// ForwardAdd applies the layer to x + r, as one fused op (AddLayerNorm):
// a post-norm residual block.
func (l LayerNormLayer) ForwardAdd(x, r Tensor) Tensor { return AddLayerNorm(x, r, l.W, l.B, l.Eps) }

// Err returns the first error met declaring the layer.
func (l LayerNormLayer) Err() error { return firstErr(l.W, l.B) }

func firstErr(ts ...Tensor) error {
	for _, t := range ts {
		if t.err != nil {
			return t.err
		}
	}
	return nil
}

// RMSNormLayer is torch.nn.RMSNorm over the last dim: x/√(mean(x²) +
// eps)·W.
type RMSNormLayer struct {
	W   Tensor
	Eps float64
}

// NewRMSNorm declares name+".weight" (ones).
func NewRMSNorm(c *InitContext, name string, dim int64, eps float64) RMSNormLayer {
	return RMSNormLayer{W: c.Param(name+".weight", Ones(), dim), Eps: eps}
}

// Forward applies the layer.
func (l RMSNormLayer) Forward(x Tensor) Tensor { return RMSNorm(x, l.W, l.Eps) }

// Err returns the first error met declaring the layer.
func (l RMSNormLayer) Err() error { return l.W.err }

// EmbeddingLayer is torch.nn.Embedding: a table [num, dim] of rows looked
// up by id.
type EmbeddingLayer struct {
	W Tensor
}

// NewEmbedding declares name+".weight" [num, dim], drawn from N(0, 1) as
// PyTorch does.
func NewEmbedding(c *InitContext, name string, num, dim int64) EmbeddingLayer {
	return EmbeddingLayer{W: c.Param(name+".weight", Normal(0, 1), num, dim)}
}

// Forward looks up ids (int32 or int64, any shape) and returns
// [ids..., dim].
func (l EmbeddingLayer) Forward(ids Tensor) Tensor { return Embedding(ids, l.W) }

// Err returns the first error met declaring the layer.
func (l EmbeddingLayer) Err() error { return l.W.err }

// MultiheadAttentionLayer is torch.nn.MultiheadAttention used for
// self-attention, with batch-first tensors and no dropout. Its parameters
// have PyTorch's layout: InProjW [3d, d] and InProjB [3d] hold the query,
// key and value projections stacked in that order, and Out is the output
// projection.
type MultiheadAttentionLayer struct {
	InProjW, InProjB Tensor
	Out              LinearLayer
	Dim, Heads       int64
}

// NewMultiheadAttention declares name+".in_proj_weight" [3d, d],
// name+".in_proj_bias" [3d], name+".out_proj.weight" [d, d] and
// name+".out_proj.bias" [d], initialised as PyTorch does: xavier_uniform
// (±√(6/(d+3d))) for in_proj_weight, zeros for both biases, and
// out_proj.weight like nn.Linear (±1/√d). heads must divide dim.
func NewMultiheadAttention(c *InitContext, name string, dim, heads int64) MultiheadAttentionLayer {
	l := MultiheadAttentionLayer{Dim: dim, Heads: heads}
	if heads <= 0 || dim%heads != 0 {
		err := &HostError{Func: abi.FuncParamNew, Errno: abi.ErrInvalidArgument, Msg: "multihead attention: heads must divide dim"}
		l.InProjW, l.InProjB = Tensor{err: err}, Tensor{err: err}
		l.Out = LinearLayer{W: Tensor{err: err}, B: Tensor{err: err}}
		return l
	}
	xavier := math.Sqrt(6 / float64(dim+3*dim))
	bound := 1 / math.Sqrt(float64(dim))
	l.InProjW = c.Param(name+".in_proj_weight", Uniform(-xavier, xavier), 3*dim, dim)
	l.InProjB = c.Param(name+".in_proj_bias", Zeros(), 3*dim)
	l.Out = LinearLayer{
		W: c.Param(name+".out_proj.weight", Uniform(-bound, bound), dim, dim),
		B: c.Param(name+".out_proj.bias", Zeros(), dim),
	}
	return l
}

// Forward applies self-attention to x [B, T, d] and returns [B, T, d].
// keyPaddingMask is a bool [B, T] tensor, true at padding positions
// (PyTorch's key_padding_mask), or a zero Tensor{} for none; causal masks
// later positions.
func (l MultiheadAttentionLayer) Forward(x, keyPaddingMask Tensor, causal bool) Tensor {
	shape, err := x.Shape()
	if err != nil {
		return Tensor{err: err}
	}
	if len(shape) != 3 {
		return Tensor{err: &HostError{Func: abi.FuncOp, Errno: abi.ErrShapeMismatch, Msg: "multihead attention: x must be [B, T, d]"}}
	}
	b, t, dh := shape[0], shape[1], l.Dim/l.Heads
	// [B,T,3d] → q, k, v [B,T,d] → [B,T,H,dh] → [B,H,T,dh]
	qkv := Split(Linear(x, l.InProjW, l.InProjB), -1, l.Dim, l.Dim, l.Dim)
	for i := range qkv {
		qkv[i] = Permute(Reshape(qkv[i], b, t, l.Heads, dh), 0, 2, 1, 3)
	}
	a := Attention(qkv[0], qkv[1], qkv[2], keyPaddingMask, causal, 0)
	// [B,H,T,dh] → [B,T,H,dh] → [B,T,d]
	return l.Out.Forward(Reshape(Permute(a, 0, 2, 1, 3), b, t, l.Dim))
}

// Err returns the first error met declaring the layer.
func (l MultiheadAttentionLayer) Err() error { return firstErr(l.InProjW, l.InProjB, l.Out.W, l.Out.B) }
