package gpuhost

import (
	"errors"
	"runtime"
)

// The CPU GEMM follows Goto's scheme: op(B) is packed into KC×NC blocks of
// NR-wide column panels, op(A) into MC×KC blocks of MR-high row panels, and
// a register-blocked micro-kernel multiplies one A panel by one B panel.
// Packing absorbs the transposes, so every variant runs the same unit-stride
// micro-kernel. Two kernels share this driver: a 6×16 AVX2/FMA assembly
// kernel (gemm_asm.go) where the CPU has those features, and a portable 2×4
// Go kernel (gemm_go.go) everywhere else, including builds with -tags
// purego.
const (
	// gemmMinWork is the number of multiply-adds below which a second
	// goroutine costs more than it saves.
	gemmMinWork = 1 << 17

	// gemmTinyWork is the number of multiply-adds up to which a plain
	// loop beats packing.
	gemmTinyWork = 1 << 11
)

// gemmBufs are one worker's packing buffers, and the stop signal of the
// product it is working on.
type gemmBufs struct {
	a, b []float32
	stop <-chan struct{}
}

// stopped reports whether the product should be given up: the serial
// kernels check it between MC×KC×NC blocks, a few milliseconds of work.
func (g *gemmBufs) stopped() bool {
	select {
	case <-g.stop:
		return true
	default:
		return false
	}
}

// stopped reports whether stop is closed; a nil stop never is.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// errStopped is a kernel's error when it gave up because its op's context
// ended; ApplyMultiContext returns the context's error instead.
var errStopped = errors.New("stopped")

// get returns packing buffers of at least na and nb floats, growing them
// if needed.
func (g *gemmBufs) get(na, nb int) (a, b []float32) {
	if len(g.a) < na {
		g.a = make([]float32, na)
	}
	if len(g.b) < nb {
		g.b = make([]float32, nb)
	}
	return g.a, g.b
}

// getBufs returns packing buffers from the device's pool, so that
// concurrent calls never share scratch.
// getBufs takes idle packing buffers, or new ones. A free list rather than
// a sync.Pool: the GC empties a pool, and the buffers (up to a few MiB)
// would be allocated again after every collection.
func (d *cpuDevice) getBufs() *gemmBufs {
	d.packMu.Lock()
	defer d.packMu.Unlock()
	if n := len(d.packs); n > 0 {
		g := d.packs[n-1]
		d.packs = d.packs[:n-1]
		return g
	}
	return new(gemmBufs)
}

// putBufs returns packing buffers; at most two per thread are kept.
func (d *cpuDevice) putBufs(g *gemmBufs) {
	d.packMu.Lock()
	defer d.packMu.Unlock()
	if len(d.packs) < 2*d.threads {
		d.packs = append(d.packs, g)
	}
}

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
	ep := epilogue{bias: bs, gelu: true, path: d.kpath()}
	d.gemmEpi(y.stop, false, true, m, n, k, x.f32(), w.f32(), y.f32(), false, ep)
	if stopped(y.stop) {
		return errStopped
	}
	return nil
}

// gemmF32 computes c (+)= op(a)·op(b) on slices, splitting the larger of m
// and n across the device's threads.
func (d *cpuDevice) gemmF32(ta, tb bool, m, n, k int, a, b, c []float32, acc bool) {
	d.gemmStop(nil, ta, tb, m, n, k, a, b, c, acc, nil)
}

// gemmStop is gemmF32 that leaves c half-written once stop is closed, and
// adds bias (n values, or nil) to every row of c.
func (d *cpuDevice) gemmStop(stop <-chan struct{}, ta, tb bool, m, n, k int, a, b, c []float32, acc bool, bias []float32) {
	d.gemmEpi(stop, ta, tb, m, n, k, a, b, c, acc, epilogue{bias: bias})
}

// gemmEpi is gemmStop with a whole epilogue: the bias, and gelu_tanh
// (linear_gelu_tanh).
func (d *cpuDevice) gemmEpi(stop <-chan struct{}, ta, tb bool, m, n, k int, a, b, c []float32, acc bool, ep epilogue) {
	if m <= 0 || n <= 0 {
		return
	}
	if k <= 0 || d.sgemm != nil || d.kpath() == pathGo || m*n*k <= gemmTinyWork {
		// Paths without an epilogue: a second pass.
		switch {
		case k <= 0 && !acc:
			clear(c[:m*n])
		case k <= 0:
		case d.sgemm != nil:
			d.sgemm(d.threads, ta, tb, m, n, k, a, b, c, acc)
		default:
			d.gemmSplit(stop, ta, tb, m, n, k, a, b, c, acc, epilogue{})
		}
		if !stopped(stop) {
			ep.apply(c, m, n, n)
		}
		return
	}
	d.gemmSplit(stop, ta, tb, m, n, k, a, b, c, acc, ep)
}

// epilogue is what the GEMM does to each finished tile of c while it is
// still in cache: add bias (a value per column), then, with gelu, replace
// each value by its gelu_tanh. The zero epilogue does nothing.
type epilogue struct {
	bias []float32
	gelu bool
	path gemmPath // the gelu kernels' width
}

// at returns the epilogue of the block of c that starts col columns on.
func (e epilogue) at(col int) epilogue {
	if e.bias != nil {
		e.bias = e.bias[col:]
	}
	return e
}

// apply runs e over the rows×cols block of c at c[0] (row stride ldc)
// in a pass of its own, for the paths whose kernels have no epilogue.
func (e epilogue) apply(c []float32, rows, cols, ldc int) {
	for r := range rows {
		row := c[r*ldc:][:cols]
		if e.bias != nil {
			for j, v := range e.bias[:cols] {
				row[j] += v
			}
		}
		e.activate(row)
	}
}

// activate applies the activation, if any, to row.
func (e epilogue) activate(row []float32) {
	if !e.gelu {
		return
	}
	done := geluForwardVec(row, row, e.path)
	geluForward32(row[done:], row[done:])
}

// gemmSplit splits the larger of m and n across the device's threads; the
// assembly paths add bias in their epilogue.
func (d *cpuDevice) gemmSplit(stop <-chan struct{}, ta, tb bool, m, n, k int, a, b, c []float32, acc bool, ep epilogue) {
	lda, ldb := k, n
	if ta {
		lda = m
	}
	if tb {
		ldb = k
	}
	if m*n*k <= gemmTinyWork {
		gemmTiny(ta, tb, m, n, k, a, lda, b, ldb, c, n, acc)
		ep.apply(c, m, n, n)
		return
	}
	mr, nr := goMR, goNR
	switch d.kpath() {
	case pathAVX2:
		mr, nr = asmMR, asmNR
	case pathAVX512:
		mr, nr = zmmMR, zmmNR
	}
	workers := min(d.threads, max(1, m*n*k/max(d.minWork, 1)))
	splitN := n >= m
	unit, units := mr, (m+mr-1)/mr
	if splitN {
		unit, units = nr, (n+nr-1)/nr
	}
	workers = min(workers, units)
	if workers <= 1 {
		d.gemmSerial(stop, ta, tb, m, n, k, a, lda, b, ldb, c, n, acc, ep)
		return
	}
	var wg join
	for w := range workers {
		lo := units * w / workers * unit
		hi := units * (w + 1) / workers * unit
		run := func() {
			if splitN {
				hi := min(hi, n)
				bo := lo // column lo of op(B)
				if tb {
					bo = lo * ldb
				}
				d.gemmSerial(stop, ta, tb, m, hi-lo, k, a, lda, b[bo:], ldb, c[lo:], n, acc, ep.at(lo))
			} else {
				hi := min(hi, m)
				ao := lo * lda // row lo of op(A)
				if ta {
					ao = lo
				}
				d.gemmSerial(stop, ta, tb, hi-lo, n, k, a[ao:], lda, b, ldb, c[lo*n:], n, acc, ep)
			}
		}
		if w == workers-1 {
			run()
			continue
		}
		wg.Go(run)
	}
	wg.Wait()
}

// gemmSerial computes the m×n block of c at c[0] (row stride ldc) on the
// calling goroutine, locked to its OS thread meanwhile. The Go scheduler
// preempts a goroutine every 10 ms, and one it preempts goes back to the
// global run queue while an idle P's thread is woken; that thread, on the
// other core, often took it, and the product went on with cold L1 and L2
// caches and packed A gone. Locked, the goroutine can resume only on its
// own thread. Measured on Zen 5 at one thread, 40 interleaved rounds: the
// median round ran at 0.78–0.84× OpenBLAS unlocked (about 25 CPU
// migrations a second) and 0.90–0.98× locked (3–6); OpenBLAS, inside a
// cgo call, is never preempted. At two threads it gained 0–20%.
func (d *cpuDevice) gemmSerial(stop <-chan struct{}, ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool, ep epilogue) {
	runtime.LockOSThread()
	bufs := d.getBufs()
	bufs.stop = stop
	defer func() {
		bufs.stop = nil
		d.putBufs(bufs)
		runtime.UnlockOSThread()
	}()
	if d.kpath() != pathGo && !ta && tb && m <= dotMaxM {
		gemmDotSerial(d.kpath() == pathAVX512, m, n, k, a, lda, b, ldb, c, ldc, acc, ep.bias)
		ep.bias = nil // added
		ep.apply(c, m, n, ldc)
		return
	}
	switch d.kpath() {
	case pathAVX2:
		gemmSerialAsm(bufs, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc, ep)
		return
	case pathAVX512:
		gemmSerialZmm(bufs, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc, ep)
		return
	}
	gemmSerialGo(bufs, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc)
	ep.apply(c, m, n, ldc)
}

// gemmTiny computes small products with a plain loop: packing them would
// cost more than the arithmetic.
func gemmTiny(ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	for i := range m {
		row := c[i*ldc : i*ldc+n]
		if !acc {
			clear(row)
		}
		for p := range k {
			ai := i*lda + p
			if ta {
				ai = p*lda + i
			}
			av := a[ai]
			if !tb {
				brow := b[p*ldb : p*ldb+n]
				for j, bv := range brow {
					row[j] += av * bv
				}
				continue
			}
			for j := range row {
				row[j] += av * b[j*ldb+p]
			}
		}
	}
}
