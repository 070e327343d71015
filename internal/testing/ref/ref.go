// Package ref holds the float64 reference kernels and the error measure
// that gpuhost's and host's tests check devices against. They are
// written from the ops' definitions (torch's, hivemind's) as plain
// loops, and this package imports nothing of ours, so that a bug in
// gpuhost cannot hide in its own reference; both suites share one copy,
// so that a fix to a reference reaches every test. It serves tests only,
// as wazero's internal/testing packages do.
package ref

import "math"

// MatMul returns op(a)·op(b) in float64 for an m×k op(a) and a k×n
// op(b): a holds m×k row-major, or k×m when ta; b holds k×n, or n×k
// when tb. Each sum runs over p in order, as a triple loop.
func MatMul[T float32 | float64](ta, tb bool, m, n, k int, a, b []T) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for p := range k {
				av := a[i*k+p]
				if ta {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if tb {
					bv = b[j*k+p]
				}
				s += float64(av) * float64(bv)
			}
			c[i*n+j] = s
		}
	}
	return c
}

// Linear returns x·wᵀ + b for x [rows, in], w [out, in] and b [out]; b
// may be nil.
func Linear(x, w, b []float64, in, out int) []float64 {
	rows := len(x) / in
	y := make([]float64, rows*out)
	for r := range rows {
		for o := range out {
			s := 0.0
			if b != nil {
				s = b[o]
			}
			for i := range in {
				s += x[r*in+i] * w[o*in+i]
			}
			y[r*out+o] = s
		}
	}
	return y
}

// Add returns a + b, the shorter one repeated along the longer (a
// broadcast over leading dims).
func Add(a, b []float64) []float64 {
	if len(a) < len(b) {
		a, b = b, a
	}
	y := make([]float64, len(a))
	for i := range a {
		y[i] = a[i] + b[i%len(b)]
	}
	return y
}

// GeluTanh returns gelu with torch's tanh approximation,
// ½x(1 + tanh(√(2/π)(x + 0.044715x³))), of each element.
func GeluTanh(x []float64) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
	}
	return y
}

// LayerNorm normalises each row of len(w) elements of x with the biased
// variance, as torch's layer_norm: (x − mean)/√(var + eps)·w + b.
func LayerNorm(x, w, b []float64, eps float64) []float64 {
	h := len(w)
	y := make([]float64, len(x))
	for r := 0; r < len(x)/h; r++ {
		row := x[r*h : (r+1)*h]
		var mean, v float64
		for _, e := range row {
			mean += e
		}
		mean /= float64(h)
		for _, e := range row {
			v += (e - mean) * (e - mean)
		}
		v /= float64(h)
		for i, e := range row {
			y[r*h+i] = (e-mean)/math.Sqrt(v+eps)*w[i] + b[i]
		}
	}
	return y
}

// Dot returns Σ a·b.
func Dot(a, b []float64) float64 {
	s := 0.0
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// RelErr returns ‖got − want‖ / ‖want‖, or ‖got − want‖ when want is
// zero, over want's elements. A NaN anywhere gives +Inf, so that it
// fails every "err > tol" check, which NaN itself would pass.
func RelErr(got []float32, want []float64) float64 {
	var d, w float64
	for i, v := range want {
		e := float64(got[i]) - v
		d += e * e
		w += v * v
	}
	if math.IsNaN(d) {
		return math.Inf(1)
	}
	if w == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / w)
}
