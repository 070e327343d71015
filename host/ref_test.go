package host

import "math"

// ffnRef is hivemind's ffn in float64, written from the definition and
// independent of gpuhost: LayerNorm(x + W2·gelu_tanh(W1·x + b1) + b2).
type ffnRef struct {
	h              int
	w1, b1, w2, b2 []float64 // w1 [4h,h], w2 [h,4h]
	lnW, lnB       []float64
	eps            float64
}

func geluTanh64(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// forward maps x [n,h] to y [n,h].
func (f *ffnRef) forward(x []float64) []float64 {
	hid := linear64(x, f.w1, f.b1, f.h, 4*f.h)
	for i, v := range hid {
		hid[i] = geluTanh64(v)
	}
	z := linear64(hid, f.w2, f.b2, 4*f.h, f.h)
	for i := range z {
		z[i] += x[i]
	}
	return layerNorm64(z, f.lnW, f.lnB, f.h, f.eps)
}

// params returns the reference's parameters in the expert's declaration
// order: ffn.weight, ffn.bias, ffn_output.weight, ffn_output.bias,
// layer_norm.weight, layer_norm.bias.
func (f *ffnRef) params() [][]float64 {
	return [][]float64{f.w1, f.b1, f.w2, f.b2, f.lnW, f.lnB}
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// relErr returns ‖got−want‖/‖want‖.
func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
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
