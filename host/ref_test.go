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
	h, h4 := f.h, 4*f.h
	n := len(x) / h
	y := make([]float64, len(x))
	hid := make([]float64, h4)
	z := make([]float64, h)
	for r := 0; r < n; r++ {
		xr := x[r*h : (r+1)*h]
		for j := 0; j < h4; j++ {
			s := f.b1[j]
			for k := 0; k < h; k++ {
				s += f.w1[j*h+k] * xr[k]
			}
			hid[j] = geluTanh64(s)
		}
		for j := 0; j < h; j++ {
			s := f.b2[j]
			for k := 0; k < h4; k++ {
				s += f.w2[j*h4+k] * hid[k]
			}
			z[j] = xr[j] + s
		}
		var mean, v float64
		for _, a := range z {
			mean += a
		}
		mean /= float64(h)
		for _, a := range z {
			v += (a - mean) * (a - mean)
		}
		v /= float64(h)
		for j, a := range z {
			y[r*h+j] = (a-mean)/math.Sqrt(v+f.eps)*f.lnW[j] + f.lnB[j]
		}
	}
	return y
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
