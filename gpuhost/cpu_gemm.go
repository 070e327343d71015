package gpuhost

import "github.com/moehost/moehost/gpuhost/internal/cpu"

// gemm implements kernels.gemm. It gives up early with errStopped once
// c's stop is closed.
func (d *cpuDevice) gemm(ta, tb bool, m, n, k int, a, b, c *Tensor, acc bool) error {
	d.gemmStop(c.stop, ta, tb, m, n, k, a.f32(), b.f32(), c.f32(), acc, nil)
	if stopped(c.stop) {
		return errStopped
	}
	return nil
}

// linear computes y = x·wᵀ + bias (x m×k, w n×k, bias n values) with the
// bias added in the GEMM's epilogue, while each tile is still in
// registers, rather than in a second pass over y.
func (d *cpuDevice) linear(m, n, k int, x, w, bias, y *Tensor) error {
	d.gemmStop(y.stop, false, true, m, n, k, x.f32(), w.f32(), y.f32(), false, bias.f32())
	if stopped(y.stop) {
		return errStopped
	}
	return nil
}

// linearGelu computes y = gelu_tanh(x·wᵀ + bias); bias may be nil. pre,
// when not nil, receives x·wᵀ + bias for the backward. Without pre the
// bias and gelu run in the GEMM's epilogue: each tile is activated while
// it is in L1, so the pre-activation never makes a round trip through
// memory. With pre, the product goes to pre and gelu reads it from there
// in a pass of its own: copying each tile to pre in the epilogue measured
// slower (RATIONALE, the fused ops).
func (d *cpuDevice) linearGelu(m, n, k int, x, w, bias, y, pre *Tensor) error {
	var bs []float32
	if bias != nil {
		bs = bias.f32()
	}
	if pre != nil {
		d.gemmStop(y.stop, false, true, m, n, k, x.f32(), w.f32(), pre.f32(), false, bs)
		if stopped(y.stop) {
			return errStopped
		}
		return d.geluForward(y, pre)
	}
	d.mm.Run(d.kpath(), y.stop, false, true, m, n, k, x.f32(), w.f32(), y.f32(), false, cpu.Epilogue{Bias: bs, Gelu: true})
	if stopped(y.stop) {
		return errStopped
	}
	return nil
}

// gemmStop computes c (+)= op(a)·op(b) on slices, splitting the larger
// of m and n across the device's threads; it leaves c half-written once
// stop is closed, and adds bias (n values, or nil) to every row of c.
func (d *cpuDevice) gemmStop(stop <-chan struct{}, ta, tb bool, m, n, k int, a, b, c []float32, acc bool, bias []float32) {
	d.mm.Run(d.kpath(), stop, ta, tb, m, n, k, a, b, c, acc, cpu.Epilogue{Bias: bias})
}
