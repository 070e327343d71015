//go:build cuda || cudaemu

package gpuhost

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost/internal/cuda"
)

// The CUDA device's GEMM, elementwise and optimizer kernels
// (kernels/elementwise.cu, kernels/optim.cu, and the driver's Sgemm). Each
// is one launch or one GEMM on the device's stream, so it runs to its end
// once issued; ops of several launches check their output's stop channel
// before each.

// gemm implements kernels.gemm through the driver's row-major Sgemm: acc
// is beta 1, and beta 0 never reads c.
func (d *cudaDevice) gemm(ta, tb bool, m, n, k int, a, b, c *Tensor, acc bool) error {
	lda, ldb := k, n
	if ta {
		lda = m
	}
	if tb {
		ldb = k
	}
	var beta float32
	if acc {
		beta = 1
	}
	if err := d.ctx.Sgemm(ta, tb, m, n, k, 1, a.dptr(), lda, b.dptr(), ldb, beta, c.dptr(), n); err != nil {
		return fmt.Errorf("%s: gemm %d×%d×%d: %w", d.Name(), m, n, k, err)
	}
	return nil
}

// bmm implements kernels.bmm: one strided batched GEMM when every c is
// written by one batch and a and b are each one matrix or one per batch;
// otherwise one GEMM per batch, in order, so that the batches that add
// into one c never race.
func (d *cudaDevice) bmm(ta, tb bool, batch, m, n, k int, a *Tensor, na int, b *Tensor, nb int, c *Tensor, nc int, acc bool) error {
	lda, ldb := k, n
	if ta {
		lda = m
	}
	if tb {
		ldb = k
	}
	sa, sb, sc := int64(m*k), int64(k*n), int64(m*n)
	var beta float32
	if acc {
		beta = 1
	}
	perBatch := func(cnt int, s int64) (int64, bool) {
		switch cnt {
		case batch:
			return s, true
		case 1:
			return 0, true
		}
		return 0, false
	}
	strideA, okA := perBatch(na, sa)
	strideB, okB := perBatch(nb, sb)
	if okA && okB && nc == batch {
		if err := d.ctx.SgemmStridedBatched(ta, tb, m, n, k, 1, a.dptr(), lda, strideA, b.dptr(), ldb, strideB, beta, c.dptr(), n, sc, batch); err != nil {
			return fmt.Errorf("%s: bmm %d×(%d×%d×%d): %w", d.Name(), batch, m, n, k, err)
		}
		return nil
	}
	const f32 = 4
	for i := range batch {
		if stopped(c.stop) {
			return errStopped
		}
		j := i % nc
		bt := beta
		if i >= nc {
			bt = 1 // the batches after the first add into c_j
		}
		ap := a.dptr() + cuda.Ptr(int64(i%na)*sa*f32)
		bp := b.dptr() + cuda.Ptr(int64(i%nb)*sb*f32)
		cp := c.dptr() + cuda.Ptr(int64(j)*sc*f32)
		if err := d.ctx.Sgemm(ta, tb, m, n, k, 1, ap, lda, bp, ldb, bt, cp, n); err != nil {
			return fmt.Errorf("%s: bmm batch %d of %d×%d×%d: %w", d.Name(), i, m, n, k, err)
		}
	}
	return nil
}

// addRepeat implements kernels.addRepeat.
func (d *cudaDevice) addRepeat(dst, src, small *Tensor) error {
	return d.launch1D("moe_add_repeat_f32", dst.n, dst.dptr(), src.dptr(), small.dptr(), int64(dst.n), int64(small.n))
}

// sumRows implements kernels.sumRows: a block of 32×8 threads for each 32
// columns.
func (d *cudaDevice) sumRows(dst, src *Tensor) error {
	g := uint32((dst.n + 31) / 32)
	return d.launch("moe_sum_rows_f32", cuda.Dim3{X: g, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 8, Z: 1}, dst.dptr(), src.dptr(), int64(src.n/dst.n), int64(dst.n))
}

// copy implements kernels.copy with a device copy.
func (d *cudaDevice) copy(dst, src *Tensor) error {
	if err := d.ctx.CopyDevice(dst.dptr(), src.dptr(), int64(4*src.n)); err != nil {
		return fmt.Errorf("%s: copy: %w", d.Name(), err)
	}
	return nil
}

// geluForward implements kernels.geluForward.
func (d *cudaDevice) geluForward(y, x *Tensor) error {
	return d.launch1D("moe_gelu_f32", x.n, y.dptr(), x.dptr(), int64(x.n))
}

// geluBackward implements kernels.geluBackward.
func (d *cudaDevice) geluBackward(gx, x, gy *Tensor) error {
	return d.launch1D("moe_gelu_backward_f32", x.n, gx.dptr(), x.dptr(), gy.dptr(), int64(x.n))
}

// unary implements kernels.unary; fn is passed as its number, which
// elementwise.cu's MOE_UNARY_* constants follow.
func (d *cudaDevice) unary(fn unaryFn, p float64, y, x *Tensor) error {
	return d.launch1D("moe_unary_f32", x.n, int32(fn), p, y.dptr(), x.dptr(), int64(x.n))
}

// unaryBackward implements kernels.unaryBackward.
func (d *cudaDevice) unaryBackward(fn unaryFn, p float64, gx, x, y, gy *Tensor) error {
	return d.launch1D("moe_unary_backward_f32", x.n, int32(fn), p, gx.dptr(), x.dptr(), y.dptr(), gy.dptr(), int64(x.n))
}

// binary implements kernels.binary.
func (d *cudaDevice) binary(fn binaryFn, dst, a, b *Tensor) error {
	return d.launch1D("moe_binary_f32", dst.n, int32(fn), dst.dptr(), a.dptr(), int64(a.n), b.dptr(), int64(b.n), int64(dst.n))
}

// castKind is moe_cast_f32's source dtype, as elementwise.cu's
// MOE_CAST_* constants number them.
func castKind(dt abi.DType) int32 {
	switch dt {
	case abi.DTypeInt32:
		return 0
	case abi.DTypeInt64:
		return 1
	}
	return 2 // bool
}

// cast implements kernels.cast.
func (d *cudaDevice) cast(dst, src *Tensor) error {
	return d.launch1D("moe_cast_f32", dst.n, dst.dptr(), src.dptr(), castKind(src.dt), int64(dst.n))
}

// sgdStep implements kernels.sgdStep; a nil buf is a null pointer.
func (d *cudaDevice) sgdStep(p, g, buf *Tensor, c sgdCoeffs) error {
	var bp cuda.Ptr
	if buf != nil {
		bp = buf.dptr()
	}
	return d.launch1D("moe_sgd_step_f32", p.n, p.dptr(), g.dptr(), bp, int64(p.n),
		float32(c.lr), float32(c.momentum), float32(c.weightDecay), float32(c.gradScale))
}

// adamStep implements kernels.adamStep with the CPU's scalars.
func (d *cudaDevice) adamStep(p, g, m, v *Tensor, c adamCoeffs) error {
	var decoupled int32
	if c.decoupled {
		decoupled = 1
	}
	return d.launch1D("moe_adam_step_f32", p.n, p.dptr(), g.dptr(), m.dptr(), v.dptr(), int64(p.n),
		float32(c.weightDecay), 1-c.lr*c.weightDecay, decoupled, float32(c.gradScale),
		float32(1-c.beta1), float32(c.beta2), float32(1-c.beta2), float32(c.lr/c.bc1),
		float32(math.Sqrt(c.bc2)), float32(c.eps))
}

// sumSquares implements kernels.sumSquares in two passes over float64:
// each block of launch1D's grid sums its share into a partial, and one
// block sums the partials. The partials' scratch is charged against the
// ceiling like any tensor.
func (d *cudaDevice) sumSquares(x *Tensor) (float64, error) {
	blocks := min((x.n+cudaBlock-1)/cudaBlock, cudaMaxGrid)
	scratch, err := d.getBuf(8*int64(blocks+1), true)
	if err != nil {
		return 0, fmt.Errorf("%s: sum of squares: %w", d.Name(), err)
	}
	defer d.putBuf(scratch)
	out := scratch.ptr + cuda.Ptr(8*blocks)
	if err := d.launch1D("moe_sum_squares_partial_f64", x.n, scratch.ptr, x.dptr(), int64(x.n)); err != nil {
		return 0, err
	}
	if err := d.launch("moe_sum_f64", cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: cudaBlock, Y: 1, Z: 1}, out, scratch.ptr, int32(blocks)); err != nil {
		return 0, err
	}
	var s float64
	if err := d.ctx.CopyOut(unsafe.Pointer(&s), out, 8); err != nil {
		return 0, fmt.Errorf("%s: sum of squares: %w", d.Name(), err)
	}
	return s, nil
}
