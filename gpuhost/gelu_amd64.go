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

// geluForwardVec runs the AVX2 kernel over the whole 8-lane part of x and
// returns how many elements it did. Call it only when gemmHaveAsm is set
// (the device's asm field).
func geluForwardVec(y, x []float32) int {
	n := len(x) &^ 7
	if n == 0 {
		return 0
	}
	y = y[:len(x)]
	geluForwardAVX2(&y[0], &x[0], n)
	return n
}

// geluBackwardVec is geluForwardVec for geluBackwardAVX2.
func geluBackwardVec(gx, x, gy []float32) int {
	n := len(x) &^ 7
	if n == 0 {
		return 0
	}
	gx, gy = gx[:len(x)], gy[:len(x)]
	geluBackwardAVX2(&gx[0], &x[0], &gy[0], n)
	return n
}
