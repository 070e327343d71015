//go:build amd64 && !purego

package gpuhost

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

// geluForwardVec runs the vector kernels over the whole 8-lane part of x
// and returns how many elements they did: with wide, the AVX-512 kernel
// over the 16-lane part and the AVX2 one over a remaining 8. Call it only
// when gemmHaveAsm is set (the device's asm field), with wide only on a
// CPU with AVX-512F (its wide field).
func geluForwardVec(y, x []float32, wide bool) int {
	y = y[:len(x)]
	n16, n8 := rowRuns(len(x), true, wide)
	if n16 > 0 {
		geluForwardAVX512(&y[0], &x[0], n16)
	}
	if n8 > n16 {
		geluForwardAVX2(&y[n16], &x[n16], n8-n16)
	}
	return n8
}

// geluBackwardVec is geluForwardVec for the backward kernels.
func geluBackwardVec(gx, x, gy []float32, wide bool) int {
	gx, gy = gx[:len(x)], gy[:len(x)]
	n16, n8 := rowRuns(len(x), true, wide)
	if n16 > 0 {
		geluBackwardAVX512(&gx[0], &x[0], &gy[0], n16)
	}
	if n8 > n16 {
		geluBackwardAVX2(&gx[n16], &x[n16], &gy[n16], n8-n16)
	}
	return n8
}
