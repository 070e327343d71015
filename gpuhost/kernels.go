package gpuhost

// kernels is what a device implements so that Apply, Tape and the
// optimizers can run on it. It is unexported because ops validate shapes
// once, in this package, and kernels trust what they get: every tensor is
// float32 on the kernel's device, non-nil, and sized as documented. Outputs
// never alias inputs unless a method says so. A device whose kernels run
// asynchronously may return launch errors here and report later failures
// from its next copy out (ReadBytes, Float32s).
type kernels interface {
	// gemm computes op(a)·op(b) for an m×k op(a) and a k×n op(b), and
	// stores it into the m×n c, or adds it to c when acc is set. a holds
	// m×k row-major, or k×m when ta; b holds k×n, or n×k when tb. Only the
	// element counts matter, not the tensors' shapes.
	gemm(ta, tb bool, m, n, k int, a, b, c *Tensor, acc bool) error

	// addRepeat sets dst[i] = src[i] + small[i mod small.Len()]. dst may be
	// src, which makes it an in-place add (bias, gradient accumulation).
	addRepeat(dst, src, small *Tensor) error

	// sumRows sets dst[j] = Σ_i src[i·n + j] with n = dst.Len(): it sums a
	// [rows, n] view of src over rows, reducing a broadcast gradient.
	sumRows(dst, src *Tensor) error

	// copy copies src into dst; both have the same length.
	copy(dst, src *Tensor) error

	// geluForward sets y = gelu_tanh(x).
	geluForward(y, x *Tensor) error

	// geluBackward sets gx = gy · gelu_tanh'(x).
	geluBackward(gx, x, gy *Tensor) error

	// layerNormForward normalises x over rows of length w.Len() and keeps
	// each row's mean and reciprocal standard deviation for the backward.
	layerNormForward(y, mean, rstd, x, w, b *Tensor, eps float64) error

	// layerNormBackward computes the grads of x, w and b from gy and the
	// forward's mean and rstd. A nil gx, gw or gb is not computed.
	layerNormBackward(gx, gw, gb, x, w, mean, rstd, gy *Tensor) error

	// sgdStep sets p -= lr·g.
	sgdStep(p, g *Tensor, lr float64) error

	// adamStep applies one step of torch.optim.Adam to p with moments m
	// and v; bc1 and bc2 are the bias corrections 1−β1ᵗ and 1−β2ᵗ.
	adamStep(p, g, m, v *Tensor, c adamCoeffs) error
}

// adamCoeffs are the scalars of one Adam step.
type adamCoeffs struct {
	lr, beta1, beta2, eps, weightDecay float64
	bc1, bc2                           float64
}
