package cpu

import "math"

// The row kernels: each runs path p's vector kernels over a row's runs of
// 16 (AVX-512) and 8 (AVX2), as rowRuns gives them, and Go on the rest,
// so that gpuhost's CPU device calls one function per row whatever the
// width.

// GELU constants: √(2/π) and the cubic coefficient of the tanh form.
const (
	GeluC = 0.7978845608028654
	GeluA = 0.044715
)

// geluForward32 sets y = gelu_tanh(x) elementwise.
func geluForward32(y, x []float32) {
	y = y[:len(x)]
	for i, v := range x {
		t := tanh32(GeluC * (v + GeluA*v*v*v))
		y[i] = 0.5 * v * (1 + t)
	}
}

// geluBackward32 sets gx = gy·gelu_tanh'(x) elementwise.
func geluBackward32(gx, x, gy []float32) {
	gx, gy = gx[:len(x)], gy[:len(x)]
	for i, v := range x {
		v2 := v * v
		t := tanh32(GeluC * (v + GeluA*v2*v))
		dy := 0.5*(1+t) + 0.5*v*(1-t*t)*GeluC*(1+3*GeluA*v2)
		gx[i] = gy[i] * dy
	}
}

// tanh32 is tanh in float32: Eigen's rational approximation (a degree-13
// odd polynomial over a degree-6 even one), within a few float32 ulps like
// torch's vectorised tanh. x is clamped to ±9.75, where the approximation
// exceeds 1, and the result to ±1, so that tanh saturates to exactly ±1
// as float32 tanh does past about 9: gelu' is then exactly 0 there instead
// of a rounding error of 1−t² times a cubic in x.
func tanh32(x float32) float32 {
	const (
		clamp = 9.75
		a1    = 4.89352455891786e-03
		a3    = 6.37261928875436e-04
		a5    = 1.48572235717979e-05
		a7    = 5.12229709037114e-08
		a9    = -8.60467152213735e-11
		a11   = 2.00018790482477e-13
		a13   = -2.76076847742355e-16
		b0    = 4.89352518554385e-03
		b2    = 2.26843463243900e-03
		b4    = 1.18534705686654e-04
		b6    = 1.19825839466702e-06
	)
	x = max(-clamp, min(clamp, x))
	x2 := x * x
	p := x2*a13 + a11
	p = p*x2 + a9
	p = p*x2 + a7
	p = p*x2 + a5
	p = p*x2 + a3
	p = p*x2 + a1
	p *= x
	q := x2*b6 + b4
	q = q*x2 + b2
	q = q*x2 + b0
	return max(-1, min(1, p/q))
}

// GeluForward sets y = gelu_tanh(x) on path p's kernels.
func GeluForward(y, x []float32, p Path) {
	done := geluForwardVec(y, x, p)
	geluForward32(y[done:], x[done:])
}

// GeluBackward sets gx = gy·gelu_tanh'(x) on path p's kernels.
func GeluBackward(gx, x, gy []float32, p Path) {
	done := geluBackwardVec(gx, x, gy, p)
	geluBackward32(gx[done:], x[done:], gy[done:])
}

// AddRow sets o = x + s elementwise on path p's kernels.
func AddRow(o, x, s []float32, p Path) {
	o, x = o[:len(s)], x[:len(s)]
	n16, n8 := rowRuns(len(s), p)
	if n16 > 0 {
		addF32AVX512(&o[0], &x[0], &s[0], n16)
	}
	if n8 > n16 {
		addF32AVX2(&o[n16], &x[n16], &s[n16], n8-n16)
	}
	for i := n8; i < len(s); i++ {
		o[i] = x[i] + s[i]
	}
}

// AdamVec runs path p's Adam kernels (an Adam step without decoupled
// decay, coefficients k) over the runs of 8 and 16 of p, g, m and v and
// returns how many elements they did; the caller steps the rest.
func AdamVec(p, g, m, v []float32, k *AdamLanes, wd bool, path Path) int {
	return adamVec(p, g, m, v, k, wd, path)
}

// AdamLanes are gpuhost's adamStep's float32 coefficients, each in 8 lanes for the
// AVX2 kernel (the AVX-512 one broadcasts the first): scale, wd, 1−β1, β2,
// 1−β2, lr/bc1, √bc2, eps.
type AdamLanes [8][8]float32

// ExpSum returns Σ e^(x−m) for m finite and at least every x, with path
// p's vector kernels over the runs rowRuns gives them.
func ExpSum(x []float32, m float64, p Path) float64 {
	var s float64
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		s = expSumAVX512(&x[0], n16, m)
	}
	if n8 > n16 {
		s += expSumAVX2(&x[n16], n8-n16, m)
	}
	for _, v := range x[n8:] {
		s += math.Exp(float64(v) - m)
	}
	return s
}

// ExpScale sets y = e^(x−m)/s, as ExpSum.
func ExpScale(y, x []float32, m, s float64, p Path) {
	y = y[:len(x)]
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		expScaleAVX512(&y[0], &x[0], n16, m, 1/s)
	}
	if n8 > n16 {
		expScaleAVX2(&y[n16], &x[n16], n8-n16, m, 1/s)
	}
	for i := n8; i < len(x); i++ {
		y[i] = float32(math.Exp(float64(x[i])-m) / s)
	}
}

// DotF64 returns Σ x·y in float64, with the vector kernels as ExpSum.
func DotF64(x, y []float32, p Path) float64 {
	y = y[:len(x)]
	var s float64
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		s = dotF64AVX512(&x[0], &y[0], n16)
	}
	if n8 > n16 {
		s += dotF64AVX2(&x[n16], &y[n16], n8-n16)
	}
	for i := n8; i < len(x); i++ {
		s += float64(x[i]) * float64(y[i])
	}
	return s
}

// SoftmaxGrad sets gx = y·(gy − s), as DotF64.
func SoftmaxGrad(gx, y, gy []float32, s float64, p Path) {
	gx, gy = gx[:len(y)], gy[:len(y)]
	n16, n8 := rowRuns(len(y), p)
	if n16 > 0 {
		softmaxGradAVX512(&gx[0], &y[0], &gy[0], n16, s)
	}
	if n8 > n16 {
		softmaxGradAVX2(&gx[n16], &y[n16], &gy[n16], n8-n16, s)
	}
	for i := n8; i < len(y); i++ {
		gx[i] = float32(float64(y[i]) * (float64(gy[i]) - s))
	}
}
