//go:build amd64 && !purego

package cpu

// geluForwardAVX2 sets y[i] = gelu_tanh(x[i]) for i < n, a multiple of 8,
// with the arithmetic of geluForward32 in 8 lanes (and FMA).
// Implemented in gelu_amd64.s.
//
//go:noescape
func geluForwardAVX2(y, x *float32, n int)

// geluBackwardAVX2 sets gx[i] = gy[i]·gelu_tanh'(x[i]) for i < n, a
// multiple of 8, as geluBackward32 does. Implemented in gelu_amd64.s.
//
//go:noescape
func geluBackwardAVX2(gx, x, gy *float32, n int)

// geluForwardAVX512 is geluForwardAVX2 on 16 lanes (AVX-512F), n a
// multiple of 16, with the same roundings. Implemented in
// gelu512_amd64.s.
//
//go:noescape
func geluForwardAVX512(y, x *float32, n int)

// geluBackwardAVX512 is geluBackwardAVX2 on 16 lanes (AVX-512F), n a
// multiple of 16. Implemented in gelu512_amd64.s.
//
//go:noescape
func geluBackwardAVX512(gx, x, gy *float32, n int)

// geluForwardVec runs path p's vector kernels over the runs rowRuns gives
// them (none on the portable path) and returns how many elements they did:
// the whole 8-lane part of x, or 0.
func geluForwardVec(y, x []float32, p Path) int {
	y = y[:len(x)]
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		geluForwardAVX512(&y[0], &x[0], n16)
	}
	if n8 > n16 {
		geluForwardAVX2(&y[n16], &x[n16], n8-n16)
	}
	return n8
}

// geluBackwardVec is geluForwardVec for the backward kernels.
func geluBackwardVec(gx, x, gy []float32, p Path) int {
	gx, gy = gx[:len(x)], gy[:len(x)]
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		geluBackwardAVX512(&gx[0], &x[0], &gy[0], n16)
	}
	if n8 > n16 {
		geluBackwardAVX2(&gx[n16], &x[n16], &gy[n16], n8-n16)
	}
	return n8
}
