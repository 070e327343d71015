package gpuhost

import "github.com/moehost/moehost/abi"

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

	// allocDirty returns a float32 or other tensor whose storage may hold
	// a released tensor's values, for a caller that overwrites all of it
	// (a GEMM's output, with acc unset): clearing it first would be a
	// pass over memory for nothing.
	allocDirty(dt abi.DType, shape []int) (*Tensor, error)

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

	// sgdStep applies one step of torch.optim.SGD without dampening or
	// Nesterov to p, with g scaled by c.gradScale first: g += wd·p;
	// buf = momentum·buf + g; p −= lr·buf. buf is nil without momentum,
	// and then p −= lr·g.
	sgdStep(p, g, buf *Tensor, c sgdCoeffs) error

	// adamStep applies one step of torch.optim.Adam (or AdamW, when
	// c.decoupled) to p with moments m and v, with g scaled by
	// c.gradScale first; bc1 and bc2 are the bias corrections 1−β1ᵗ and
	// 1−β2ᵗ.
	adamStep(p, g, m, v *Tensor, c adamCoeffs) error

	// sumSquares returns Σ x², accumulated in float64.
	sumSquares(x *Tensor) (float64, error)

	opKernels
}

// adamCoeffs are the scalars of one Adam step.
type adamCoeffs struct {
	lr, beta1, beta2, eps, weightDecay float64
	bc1, bc2                           float64
	// decoupled applies the weight decay to p (AdamW), not to g.
	decoupled bool
	// gradScale multiplies g first (gradient clipping); 1 leaves it.
	gradScale float64
}

// sgdCoeffs are the scalars of one SGD step.
type sgdCoeffs struct {
	lr, momentum, weightDecay float64
	// gradScale multiplies g first (gradient clipping); 1 leaves it.
	gradScale float64
}

// unaryFn names an elementwise function of one tensor for the unary
// kernels. Some take a scalar parameter p.
type unaryFn int

// Unary functions.
const (
	unaryScale     unaryFn = iota // p·x
	unaryAddScalar                // x + p
	unaryRelu
	unaryGelu // exact, with erf
	unaryTanh
	unarySigmoid
	unarySilu
	unaryExp
	unaryLog
	unarySqrt
	unaryNeg
)

// binaryFn names an elementwise function of two tensors.
type binaryFn int

// Binary functions.
const (
	binaryAdd binaryFn = iota
	binarySub
	binaryMul
	binaryDiv
)

// reduceFn names a reduction along one axis.
type reduceFn int

// Reductions.
const (
	reduceSum reduceFn = iota
	reduceMean
	reduceMax
)

// attnDims are the sizes and flags of one attention op.
type attnDims struct {
	b, h, tq, tk, d, dv int
	causal              bool
	scale               float64
}

// opKernels are the kernels of the ABI's ops beyond the first five. They
// follow the rules of kernels, except where a method names a tensor of
// another dtype (ids, targets, masks, arg-max indices). An "[outer, dim,
// inner]" view is a tensor seen as three dims around one axis.
type opKernels interface {
	// unary sets y = fn(x), with p the parameter of scale and add_scalar.
	// y may be x.
	unary(fn unaryFn, p float64, y, x *Tensor) error

	// unaryBackward sets gx = gy·fn'(x); y is the forward's output,
	// which some functions use instead of x.
	unaryBackward(fn unaryFn, p float64, gx, x, y, gy *Tensor) error

	// binary sets dst[i] = a[i mod a.Len()] fn b[i mod b.Len()] for i in
	// [0, dst.Len()); each of a.Len() and b.Len() divides dst.Len(). dst
	// may be a or b when that one has dst's length.
	binary(fn binaryFn, dst, a, b *Tensor) error

	// softmax sets y to the softmax (or log-softmax) of x along the dim
	// of an [outer, dim, inner] view.
	softmax(y, x *Tensor, outer, dim, inner int, log bool) error

	// softmaxBackward sets gx from the forward's output y and gy.
	softmaxBackward(gx, y, gy *Tensor, outer, dim, inner int, log bool) error

	// rmsNormForward normalises rows of length w.Len() and keeps each
	// row's reciprocal root mean square in rstd.
	rmsNormForward(y, rstd, x, w *Tensor, eps float64) error

	// rmsNormBackward computes the grads of x and w; a nil one is not
	// computed.
	rmsNormBackward(gx, gw, x, w, rstd, gy *Tensor) error

	// permute sets dst to src with its dims reordered: dst's dim i is
	// src's dim perm[i].
	permute(dst, src *Tensor, perm []int) error

	// copy2D copies rows×width elements: dst[dOff + r·dStride + j] =
	// src[sOff + r·sStride + j].
	copy2D(dst *Tensor, dOff, dStride int, src *Tensor, sOff, sStride, rows, width int) error

	// reduceAxis reduces the dim of an [outer, dim, inner] view of src
	// into the outer×inner dst. For reduceMax, arg (int32) receives the
	// first index of each maximum; it is nil otherwise.
	reduceAxis(fn reduceFn, dst, arg, src *Tensor, outer, dim, inner int) error

	// reduceAxisBackward sets gx, an [outer, dim, inner] tensor, from the
	// outer×inner gy (and arg for reduceMax).
	reduceAxisBackward(fn reduceFn, gx, gy, arg *Tensor, outer, dim, inner int) error

	// embedding sets y's rows to table's rows selected by ids (int32 or
	// int64). It checks every id first and returns ErrArgument naming
	// the first one outside [0, V), writing nothing.
	embedding(y, ids, table *Tensor) error

	// embeddingBackward adds gy's rows into gtable's rows selected by
	// ids; the ids are valid.
	embeddingBackward(gtable, ids, gy *Tensor) error

	// cast sets dst to src (int32, int64 or bool, src's length)
	// converted to float32 as torch does: an integer rounded to the
	// nearest float32, ties to even; a bool 0 for a zero byte and 1 for
	// any other.
	cast(dst, src *Tensor) error

	// crossEntropy sets loss[r] = logsumexp(logits[r]) − logits[r, t_r]
	// and lse[r] = logsumexp(logits[r]) for the [N, C] logits and the
	// int32 or int64 targets t; rows whose target is ignore get 0. It
	// returns the number of rows not ignored, or ErrArgument naming the
	// first target outside [0, C) that is not ignore, writing nothing.
	crossEntropy(loss, lse, logits, targets *Tensor, ignore int64) (int, error)

	// crossEntropyBackward sets gx[r] = gy[r]·(softmax(logits[r]) −
	// onehot(t_r)), and zeros for ignored rows.
	crossEntropyBackward(gx, logits, lse, targets, gy *Tensor, ignore int64) error

	// bmm runs batch GEMMs: for i in [0, batch), c_(i mod nc) (+)=
	// op(a_(i mod na))·op(b_(i mod nb)), where x_j is the j-th matrix of
	// x in row-major order and op transposes as in gemm. Without acc, c
	// is cleared first.
	bmm(ta, tb bool, batch, m, n, k int, a *Tensor, na int, b *Tensor, nb int, c *Tensor, nc int, acc bool) error

	// attention computes scaled-dot-product attention into out and keeps
	// the probabilities [B,H,Tq,Tk] in probs. mask (bool [B,Tk]) may be
	// nil.
	attention(out, probs, q, k, v, mask *Tensor, a attnDims) error

	// attentionBackward computes the grads of q, k and v (nil ones are
	// skipped) from the forward's probs and gout.
	attentionBackward(gq, gk, gv, q, k, v, probs, gout *Tensor, a attnDims) error
}
