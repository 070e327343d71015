//go:build cuda || cudaemu

package gpuhost

// The CUDA device's GEMM, elementwise and optimizer kernels. Each is one
// launch (or one cuBLAS call) on the device's stream, so a single op runs
// to its end once issued; ops of several launches check their output's
// stop channel between launches.

func (d *cudaDevice) gemm(ta, tb bool, m, n, k int, a, b, c *Tensor, acc bool) error {
	return cudaPending("gemm")
}

func (d *cudaDevice) bmm(ta, tb bool, batch, m, n, k int, a *Tensor, na int, b *Tensor, nb int, c *Tensor, nc int, acc bool) error {
	return cudaPending("bmm")
}

func (d *cudaDevice) addRepeat(dst, src, small *Tensor) error { return cudaPending("addRepeat") }

func (d *cudaDevice) sumRows(dst, src *Tensor) error { return cudaPending("sumRows") }

func (d *cudaDevice) copy(dst, src *Tensor) error { return cudaPending("copy") }

func (d *cudaDevice) geluForward(y, x *Tensor) error { return cudaPending("geluForward") }

func (d *cudaDevice) geluBackward(gx, x, gy *Tensor) error { return cudaPending("geluBackward") }

func (d *cudaDevice) sgdStep(p, g, buf *Tensor, c sgdCoeffs) error { return cudaPending("sgdStep") }

func (d *cudaDevice) adamStep(p, g, m, v *Tensor, c adamCoeffs) error {
	return cudaPending("adamStep")
}

func (d *cudaDevice) sumSquares(x *Tensor) (float64, error) { return 0, cudaPending("sumSquares") }

func (d *cudaDevice) unary(fn unaryFn, p float64, y, x *Tensor) error { return cudaPending("unary") }

func (d *cudaDevice) unaryBackward(fn unaryFn, p float64, gx, x, y, gy *Tensor) error {
	return cudaPending("unaryBackward")
}

func (d *cudaDevice) binary(fn binaryFn, dst, a, b *Tensor) error { return cudaPending("binary") }
