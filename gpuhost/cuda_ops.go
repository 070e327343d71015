//go:build cuda || cudaemu

package gpuhost

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost/internal/cuda"
)

// This file holds the CUDA device's row and structured kernels: norms,
// softmax, reductions along an axis, permute, copy2D, embedding,
// cross-entropy and attention. Their CUDA C is in
// internal/cuda/kernels/{rows,index,attention}.cu; the CPU device's
// versions in cpu_kernels.go and cpu_ops.go are their oracle, and their
// errors read the same.

// normChunkRows is how many rows one block of moe_norm_wb_partial sums
// per column before moe_colsum adds the chunks: enough blocks to fill a
// GPU at batch sizes in the thousands, few enough partial sums to add.
const normChunkRows = 64

// maxNormChunks caps the partial sums of a norm's weight gradient.
const maxNormChunks = 1024

// launchRowsOf launches kernel over rows of width elements: one block a
// row, of the fewest threads from 32 to 256 (a power of two, as the block
// reductions need) that cover the row, so that short rows (a softmax
// over 8 experts) do not leave 248 of 256 threads idle. Past 65535 rows
// the grid is split into grid.y, so kernels compute their row as
// blockIdx.y·gridDim.x + blockIdx.x (moe_block_row in prelude.cuh) and
// return when it is past the last.
func (d *cudaDevice) launchRowsOf(kernel string, rows, width int, args ...any) error {
	if rows <= 0 {
		return nil
	}
	threads := 32
	for threads < width && threads < cudaBlock {
		threads *= 2
	}
	gx := min(rows, 65535)
	gy := (rows + gx - 1) / gx
	return d.launch(kernel, cuda.Dim3{X: uint32(gx), Y: uint32(gy), Z: 1}, cuda.Dim3{X: uint32(threads), Y: 1, Z: 1}, args...)
}

// nullPtr is a null pointer argument (a gradient nobody needs).
const nullPtr = cuda.Ptr(0)

// ptrOrNull returns t's device address, or null for a nil t.
func ptrOrNull(t *Tensor) cuda.Ptr {
	if t == nil {
		return nullPtr
	}
	return t.dptr()
}

// is64 is the is64 argument of the index kernels for int32 or int64 ids.
func is64(ids *Tensor) int32 {
	if ids.dt == abi.DTypeInt64 {
		return 1
	}
	return 0
}

// layerNormForward implements kernels.layerNormForward.
func (d *cudaDevice) layerNormForward(y, mean, rstd, x, w, b *Tensor, eps float64) error {
	rows, h := mean.n, w.n
	return d.launchRowsOf("moe_layernorm_fwd", rows, h, y.dptr(), mean.dptr(), rstd.dptr(), x.dptr(), w.dptr(), b.dptr(), int64(rows), int64(h), eps)
}

// layerNormBackward implements kernels.layerNormBackward.
func (d *cudaDevice) layerNormBackward(gx, gw, gb, x, w, mean, rstd, gy *Tensor) error {
	rows, h := mean.n, w.n
	if gx != nil {
		if err := d.launchRowsOf("moe_layernorm_bwd_x", rows, h, gx.dptr(), x.dptr(), w.dptr(), mean.dptr(), rstd.dptr(), gy.dptr(), int64(rows), int64(h)); err != nil {
			return err
		}
	}
	if gw == nil && gb == nil {
		return nil
	}
	stop := gradStop(gx, gw, gb)
	if gx != nil && stopped(stop) {
		return errStopped
	}
	return d.normWeightGrads(stop, gw, gb, x, mean, rstd, gy, rows, h)
}

// normWeightGrads sets gw = Σ_rows gy·x̂ and gb = Σ_rows gy (either may be
// nil) for a norm with x̂ = (x − mean)·rstd, or x·rstd when mean is nil.
// Blocks sum chunks of rows per column into scratch partial sums, and
// moe_colsum adds them up: one pass over rows per column would leave most
// of a GPU idle at hidden sizes in the thousands. It looks at stop before
// each launch after the first.
func (d *cudaDevice) normWeightGrads(stop <-chan struct{}, gw, gb, x, mean, rstd, gy *Tensor, rows, h int) error {
	rpc := normChunkRows
	chunks := (rows + rpc - 1) / rpc
	if chunks > maxNormChunks {
		rpc = (rows + maxNormChunks - 1) / maxNormChunks
		chunks = (rows + rpc - 1) / rpc
	}
	grid := cuda.Dim3{X: uint32((h + 31) / 32), Y: uint32(chunks), Z: 1}
	block := cuda.Dim3{X: cudaBlock, Y: 1, Z: 1}
	if chunks == 1 {
		return d.launch("moe_norm_wb_partial", grid, block, ptrOrNull(gw), ptrOrNull(gb), x.dptr(), ptrOrNull(mean), rstd.dptr(), gy.dptr(), int64(rows), int64(h), int64(rpc))
	}
	var pw, pb *Tensor
	defer func() { d.Release(pw, pb) }()
	var err error
	if gw != nil {
		if pw, err = d.allocDirty(abi.DTypeFloat32, []int{chunks, h}); err != nil {
			return err
		}
	}
	if gb != nil {
		if pb, err = d.allocDirty(abi.DTypeFloat32, []int{chunks, h}); err != nil {
			return err
		}
	}
	if err := d.launch("moe_norm_wb_partial", grid, block, ptrOrNull(pw), ptrOrNull(pb), x.dptr(), ptrOrNull(mean), rstd.dptr(), gy.dptr(), int64(rows), int64(h), int64(rpc)); err != nil {
		return err
	}
	for _, o := range []struct{ dst, part *Tensor }{{gw, pw}, {gb, pb}} {
		if o.dst == nil {
			continue
		}
		if stopped(stop) {
			return errStopped
		}
		if err := d.launch1D("moe_colsum", h, o.dst.dptr(), o.part.dptr(), int64(chunks), int64(h)); err != nil {
			return err
		}
	}
	return nil
}

// colsInner is the inner size from which the axis kernels take a thread
// per row (the _cols kernels) instead of a block per row: a warp's rows
// then lie side by side in memory.
const colsInner = 32

// softmax implements kernels.softmax.
func (d *cudaDevice) softmax(y, x *Tensor, outer, dim, inner int, log bool) error {
	if inner >= colsInner {
		return d.launch1D("moe_softmax_fwd_cols", outer*inner, y.dptr(), x.dptr(), int64(outer), int64(dim), int64(inner), flag32(log))
	}
	return d.launchRowsOf("moe_softmax_fwd", outer*inner, dim, y.dptr(), x.dptr(), int64(outer), int64(dim), int64(inner), flag32(log))
}

// softmaxBackward implements kernels.softmaxBackward.
func (d *cudaDevice) softmaxBackward(gx, y, gy *Tensor, outer, dim, inner int, log bool) error {
	if inner >= colsInner {
		return d.launch1D("moe_softmax_bwd_cols", outer*inner, gx.dptr(), y.dptr(), gy.dptr(), int64(outer), int64(dim), int64(inner), flag32(log))
	}
	return d.launchRowsOf("moe_softmax_bwd", outer*inner, dim, gx.dptr(), y.dptr(), gy.dptr(), int64(outer), int64(dim), int64(inner), flag32(log))
}

// flag32 is a kernel's int flag.
func flag32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// rmsNormForward implements kernels.rmsNormForward.
func (d *cudaDevice) rmsNormForward(y, rstd, x, w *Tensor, eps float64) error {
	rows, h := rstd.n, w.n
	return d.launchRowsOf("moe_rmsnorm_fwd", rows, h, y.dptr(), rstd.dptr(), x.dptr(), w.dptr(), int64(rows), int64(h), eps)
}

// rmsNormBackward implements kernels.rmsNormBackward.
func (d *cudaDevice) rmsNormBackward(gx, gw, x, w, rstd, gy *Tensor) error {
	rows, h := rstd.n, w.n
	if gx != nil {
		if err := d.launchRowsOf("moe_rmsnorm_bwd_x", rows, h, gx.dptr(), x.dptr(), w.dptr(), rstd.dptr(), gy.dptr(), int64(rows), int64(h)); err != nil {
			return err
		}
	}
	if gw == nil {
		return nil
	}
	stop := gradStop(gx, gw)
	if gx != nil && stopped(stop) {
		return errStopped
	}
	return d.normWeightGrads(stop, gw, nil, x, nil, rstd, gy, rows, h)
}

// permute implements kernels.permute: one thread per dst element finds
// its src element from dst's dims and the src stride of each, passed as
// the kernel's eight dim and eight stride arguments. Dims of size 1 are
// dropped and neighbours that are contiguous in src too are merged
// (permuteDims), so a permutation that moves nothing is a copy, and
// tensors below 2³¹ elements take 32-bit indices.
func (d *cudaDevice) permute(dst, src *Tensor, perm []int) error {
	dims, strides := permuteDims(src.shape, perm)
	if len(dims) == 0 || len(dims) == 1 && strides[0] == 1 {
		return d.copy(dst, src)
	}
	kernel := "moe_permute"
	if dst.n <= math.MaxInt32 {
		kernel = "moe_permute_u32"
	}
	args := []any{dst.dptr(), src.dptr(), int64(dst.n), int32(len(dims))}
	for i := range abi.MaxRank {
		v := int64(1)
		if i < len(dims) {
			v = dims[i]
		}
		args = append(args, v)
	}
	for i := range abi.MaxRank {
		var v int64
		if i < len(strides) {
			v = strides[i]
		}
		args = append(args, v)
	}
	return d.launch1D(kernel, dst.n, args...)
}

// permuteDims returns the dims of src permuted by perm and the src stride
// of each, without dims of size 1, and with each dim merged into the next
// when the two are contiguous in src as well (stride = next's stride ×
// next's size), which leaves the same element order with fewer dims.
func permuteDims(shape, perm []int) (dims, strides []int64) {
	sstr := make([]int64, len(shape))
	st := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		sstr[i] = st
		st *= int64(shape[i])
	}
	for _, p := range perm {
		n, s := int64(shape[p]), sstr[p]
		if n == 1 {
			continue
		}
		if k := len(dims) - 1; k >= 0 && strides[k] == s*n {
			dims[k] *= n
			strides[k] = s
			continue
		}
		dims, strides = append(dims, n), append(strides, s)
	}
	return dims, strides
}

// copy2D implements kernels.copy2D, with 32-bit indices when both
// tensors are below 2³¹ elements.
func (d *cudaDevice) copy2D(dst *Tensor, dOff, dStride int, src *Tensor, sOff, sStride, rows, width int) error {
	kernel := "moe_copy2d"
	if dst.n <= math.MaxInt32 && src.n <= math.MaxInt32 {
		kernel = "moe_copy2d_u32"
	}
	return d.launch1D(kernel, rows*width, dst.dptr(), int64(dOff), int64(dStride), src.dptr(), int64(sOff), int64(sStride), int64(rows), int64(width))
}

// reduceAxis implements kernels.reduceAxis.
func (d *cudaDevice) reduceAxis(fn reduceFn, dst, arg, src *Tensor, outer, dim, inner int) error {
	if inner >= colsInner {
		return d.launch1D("moe_reduce_axis_cols", outer*inner, dst.dptr(), ptrOrNull(arg), src.dptr(), int64(outer), int64(dim), int64(inner), int32(fn))
	}
	return d.launchRowsOf("moe_reduce_axis", outer*inner, dim, dst.dptr(), ptrOrNull(arg), src.dptr(), int64(outer), int64(dim), int64(inner), int32(fn))
}

// reduceAxisBackward implements kernels.reduceAxisBackward.
func (d *cudaDevice) reduceAxisBackward(fn reduceFn, gx, gy, arg *Tensor, outer, dim, inner int) error {
	return d.launch1D("moe_reduce_axis_bwd", gx.n, gx.dptr(), gy.dptr(), ptrOrNull(arg), int64(gx.n), int64(dim), int64(inner), int32(fn))
}

// idsCheckMaxBlocks caps the blocks of the ids check's first pass, so that
// its second pass is one block with a few partial results per thread.
const idsCheckMaxBlocks = 1024

// checkIDs runs the ids check over ids: it returns the lowest index whose
// id is outside [0, v) (ids.n if none), that id, and how many ids are in
// range. With useIgnore, ids equal to ignore are neither. Blocks find
// their lowest bad index and count (moe_ids_check_partial), one block
// folds those (moe_ids_check_finish), and one copy brings the two back.
func (d *cudaDevice) checkIDs(ids *Tensor, v int64, useIgnore bool, ignore int64) (bad int, id int64, count int, err error) {
	n := ids.n
	blocks := min((n+cudaBlock-1)/cudaBlock, idsCheckMaxBlocks)
	part, err := d.allocDirty(abi.DTypeInt64, []int{2*blocks + 2})
	if err != nil {
		return 0, 0, 0, err
	}
	defer d.Release(part)
	block := cuda.Dim3{X: cudaBlock, Y: 1, Z: 1}
	if err := d.launch("moe_ids_check_partial", cuda.Dim3{X: uint32(blocks), Y: 1, Z: 1}, block, part.dptr(), ids.dptr(), is64(ids), int64(n), v, flag32(useIgnore), ignore); err != nil {
		return 0, 0, 0, err
	}
	out := part.dptr() + cuda.Ptr(16*blocks)
	if err := d.launch("moe_ids_check_finish", cuda.Dim3{X: 1, Y: 1, Z: 1}, block, out, part.dptr(), int64(blocks), int64(n)); err != nil {
		return 0, 0, 0, err
	}
	var res [16]byte
	if err := d.ctx.CopyOut(unsafe.Pointer(&res[0]), out, 16); err != nil {
		return 0, 0, 0, fmt.Errorf("%s: reading the ids check: %w", d.Name(), err)
	}
	bad = int(int64(binary.LittleEndian.Uint64(res[:8])))
	count = int(int64(binary.LittleEndian.Uint64(res[8:])))
	if bad >= n {
		return n, 0, count, nil
	}
	sz := ids.dt.Size()
	var b [8]byte
	if err := d.ctx.CopyOut(unsafe.Pointer(&b[0]), ids.dptr()+cuda.Ptr(bad*sz), int64(sz)); err != nil {
		return 0, 0, 0, fmt.Errorf("%s: reading id %d: %w", d.Name(), bad, err)
	}
	if sz == 4 {
		id = int64(int32(binary.LittleEndian.Uint32(b[:4])))
	} else {
		id = int64(binary.LittleEndian.Uint64(b[:]))
	}
	return bad, id, count, nil
}

// embedding implements kernels.embedding.
func (d *cudaDevice) embedding(y, ids, table *Tensor) error {
	v, dd := table.shape[0], table.shape[1]
	bad, id, _, err := d.checkIDs(ids, int64(v), false, 0)
	if err != nil {
		return fmt.Errorf("embedding: %w", err)
	}
	if bad < ids.n {
		return fmt.Errorf("%w: embedding: id %d at index %d of ids %s is outside [0, %d) for table %v", ErrArgument, id, bad, ids.desc(), v, table.shape)
	}
	if stopped(y.stop) {
		return errStopped
	}
	return d.launch1D("moe_embedding_fwd", ids.n*dd, y.dptr(), ids.dptr(), is64(ids), table.dptr(), int64(ids.n), int64(dd))
}

// embeddingBackward implements kernels.embeddingBackward; rows that share
// an id add with atomicAdd, so their order (and the last bits of the sum)
// may vary from run to run.
func (d *cudaDevice) embeddingBackward(gtable, ids, gy *Tensor) error {
	dd := gtable.shape[1]
	return d.launch1D("moe_embedding_bwd", ids.n*dd, gtable.dptr(), ids.dptr(), is64(ids), gy.dptr(), int64(ids.n), int64(dd))
}

// crossEntropy implements kernels.crossEntropy.
func (d *cudaDevice) crossEntropy(loss, lse, logits, targets *Tensor, ignore int64) (int, error) {
	n, c := logits.shape[0], logits.shape[1]
	bad, t, count, err := d.checkIDs(targets, int64(c), true, ignore)
	if err != nil {
		return 0, fmt.Errorf("cross_entropy: %w", err)
	}
	if bad < n {
		return 0, fmt.Errorf("%w: cross_entropy: target %d of row %d is outside [0, %d) and is not ignore_index %d (logits %v)", ErrArgument, t, bad, c, ignore, logits.shape)
	}
	if stopped(loss.stop) {
		return 0, errStopped
	}
	if err := d.launchRowsOf("moe_cross_entropy_fwd", n, c, loss.dptr(), lse.dptr(), logits.dptr(), targets.dptr(), is64(targets), int64(n), int64(c), ignore); err != nil {
		return 0, err
	}
	return count, nil
}

// crossEntropyBackward implements kernels.crossEntropyBackward.
func (d *cudaDevice) crossEntropyBackward(gx, logits, lse, targets, gy *Tensor, ignore int64) error {
	n, c := logits.shape[0], logits.shape[1]
	return d.launch1D("moe_cross_entropy_bwd", n*c, gx.dptr(), logits.dptr(), lse.dptr(), targets.dptr(), is64(targets), gy.dptr(), int64(n), int64(c), ignore)
}

// attention implements kernels.attention with two batched GEMMs around
// moe_attn_softmax, which works in place on probs: S = q·kᵀ, P =
// softmax(S·scale) over the visible keys, out = P·v.
func (d *cudaDevice) attention(out, probs, q, k, v, mask *Tensor, a attnDims) error {
	bh := a.b * a.h
	if err := d.ctx.SgemmStridedBatched(false, true, a.tq, a.tk, a.d, 1, q.dptr(), a.d, int64(a.tq*a.d), k.dptr(), a.d, int64(a.tk*a.d), 0, probs.dptr(), a.tk, int64(a.tq*a.tk), bh); err != nil {
		return fmt.Errorf("%s: attention: q·kᵀ: %w", d.Name(), err)
	}
	if stopped(out.stop) {
		return errStopped
	}
	rows := bh * a.tq
	if err := d.launchRowsOf("moe_attn_softmax", rows, a.tk, probs.dptr(), ptrOrNull(mask), int64(rows), int64(a.h), int64(a.tq), int64(a.tk), flag32(a.causal), float32(a.scale)); err != nil {
		return err
	}
	if stopped(out.stop) {
		return errStopped
	}
	if err := d.ctx.SgemmStridedBatched(false, false, a.tq, a.dv, a.tk, 1, probs.dptr(), a.tk, int64(a.tq*a.tk), v.dptr(), a.dv, int64(a.tk*a.dv), 0, out.dptr(), a.dv, int64(a.tq*a.dv), bh); err != nil {
		return fmt.Errorf("%s: attention: P·v: %w", d.Name(), err)
	}
	return nil
}

// attentionBackward implements kernels.attentionBackward: gv = Pᵀ·gout,
// dP = gout·vᵀ into scratch, dS = P·(dP − rowsum(dP·P))·scale in place
// (moe_attn_softmax_bwd), gq = dS·k and gk = dSᵀ·q.
func (d *cudaDevice) attentionBackward(gq, gk, gv, q, k, v, probs, gout *Tensor, a attnDims) error {
	bh := a.b * a.h
	sq, sk, sv, sp, so := int64(a.tq*a.d), int64(a.tk*a.d), int64(a.tk*a.dv), int64(a.tq*a.tk), int64(a.tq*a.dv)
	stop := gradStop(gq, gk, gv)
	if gv != nil {
		if err := d.ctx.SgemmStridedBatched(true, false, a.tk, a.dv, a.tq, 1, probs.dptr(), a.tk, sp, gout.dptr(), a.dv, so, 0, gv.dptr(), a.dv, sv, bh); err != nil {
			return fmt.Errorf("%s: attention backward: Pᵀ·gout: %w", d.Name(), err)
		}
	}
	if gq == nil && gk == nil {
		return nil
	}
	ds, err := d.allocDirty(abi.DTypeFloat32, []int{bh, a.tq, a.tk})
	if err != nil {
		return fmt.Errorf("%s: attention backward: %w", d.Name(), err)
	}
	defer d.Release(ds)
	steps := []func() error{
		func() error {
			return d.ctx.SgemmStridedBatched(false, true, a.tq, a.tk, a.dv, 1, gout.dptr(), a.dv, so, v.dptr(), a.dv, sv, 0, ds.dptr(), a.tk, sp, bh)
		},
		func() error {
			rows := bh * a.tq
			return d.launchRowsOf("moe_attn_softmax_bwd", rows, a.tk, ds.dptr(), probs.dptr(), int64(rows), int64(a.tk), a.scale)
		},
		func() error {
			if gq == nil {
				return nil
			}
			return d.ctx.SgemmStridedBatched(false, false, a.tq, a.d, a.tk, 1, ds.dptr(), a.tk, sp, k.dptr(), a.d, sk, 0, gq.dptr(), a.d, sq, bh)
		},
		func() error {
			if gk == nil {
				return nil
			}
			return d.ctx.SgemmStridedBatched(true, false, a.tk, a.d, a.tq, 1, ds.dptr(), a.tk, sp, q.dptr(), a.d, sq, 0, gk.dptr(), a.d, sk, bh)
		},
	}
	for _, step := range steps {
		if stopped(stop) {
			return errStopped
		}
		if err := step(); err != nil {
			return fmt.Errorf("%s: attention backward: %w", d.Name(), err)
		}
	}
	return nil
}
