package host

import (
	"math"

	"github.com/moehost/moehost/internal/testing/ref"
)

// ffnRef is hivemind's ffn in float64, written from the definition and
// independent of gpuhost: LayerNorm(x + W2·gelu_tanh(W1·x + b1) + b2).
type ffnRef struct {
	h              int
	w1, b1, w2, b2 []float64 // w1 [4h,h], w2 [h,4h]
	lnW, lnB       []float64
	eps            float64
}

// forward maps x [n,h] to y [n,h].
func (f *ffnRef) forward(x []float64) []float64 {
	hid := ref.GeluTanh(ref.Linear(x, f.w1, f.b1, f.h, 4*f.h))
	z := ref.Linear(hid, f.w2, f.b2, 4*f.h, f.h)
	for i := range z {
		z[i] += x[i]
	}
	return ref.LayerNorm(z, f.lnW, f.lnB, f.eps)
}

// params returns the reference's parameters in the expert's declaration
// order: ffn.weight, ffn.bias, ffn_output.weight, ffn_output.bias,
// layer_norm.weight, layer_norm.bias.
func (f *ffnRef) params() [][]float64 {
	return [][]float64{f.w1, f.b1, f.w2, f.b2, f.lnW, f.lnB}
}

// finiteDiff returns the central-difference gradient of loss with respect
// to each element of v, perturbing v in place.
func finiteDiff(v []float64, loss func() float64) []float64 {
	g := make([]float64, len(v))
	for i := range v {
		old := v[i]
		step := 1e-6 * math.Max(1, math.Abs(old))
		v[i] = old + step
		lp := loss()
		v[i] = old - step
		lm := loss()
		v[i] = old
		g[i] = (lp - lm) / (2 * step)
	}
	return g
}
