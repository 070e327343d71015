package expert

import "math"

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
