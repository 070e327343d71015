package cpu

import (
	"runtime"
	"sync"
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
	// MinWork is the number of multiply-adds below which a second
	// goroutine costs more than it saves: GEMM.MinWork's default.
	MinWork = 1 << 17

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
func (g *gemmBufs) Stopped() bool {
	select {
	case <-g.stop:
		return true
	default:
		return false
	}
}

// Stopped reports whether stop is closed; a nil stop never is.
func Stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// GEMM runs the CPU GEMM on float32 slices, with the larger of m and n
// split across up to Threads goroutines, on the path each call names. It
// keeps its packing buffers across calls and is safe for concurrent use;
// it must not be copied after first use.
type GEMM struct {
	// Threads is the most goroutines one product takes (at least 1).
	Threads int
	// MinWork is the product size (m·n·k) per extra goroutine; zero
	// means MinWork, and tests lower it to split small products.
	MinWork int
	// Sgemm, when set, replaces the kernels (gpuhost's OpenBLAS
	// device): it gets Threads and no epilogue, which runs after it.
	Sgemm func(threads int, ta, tb bool, m, n, k int, a, b, c []float32, acc bool)

	packMu sync.Mutex
	packs  []*gemmBufs // idle packing buffers, kept across GCs
}

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

// getBufs returns packing buffers from the GEMM's pool, so that
// concurrent calls never share scratch.
// getBufs takes idle packing buffers, or new ones. A free list rather than
// a sync.Pool: the GC empties a pool, and the buffers (up to a few MiB)
// would be allocated again after every collection.
func (d *GEMM) getBufs() *gemmBufs {
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
func (d *GEMM) putBufs(g *gemmBufs) {
	d.packMu.Lock()
	defer d.packMu.Unlock()
	if len(d.packs) < 2*max(d.Threads, 1) {
		d.packs = append(d.packs, g)
	}
}

// F32 computes c (+)= op(a)·op(b) on p's kernels: a holds m×k
// row-major, or k×m when ta; b holds k×n, or n×k when tb; c is m×n.
func (d *GEMM) F32(p Path, ta, tb bool, m, n, k int, a, b, c []float32, acc bool) {
	d.Run(p, nil, ta, tb, m, n, k, a, b, c, acc, Epilogue{})
}

// Run is F32 with an epilogue, ep, applied to c, that gives up once stop
// is closed and leaves c half-written.
func (d *GEMM) Run(p Path, stop <-chan struct{}, ta, tb bool, m, n, k int, a, b, c []float32, acc bool, ep Epilogue) {
	if m <= 0 || n <= 0 {
		return
	}
	e := epilogue{bias: ep.Bias, gelu: ep.Gelu, path: p}
	if k <= 0 || d.Sgemm != nil || p == PathGo || m*n*k <= gemmTinyWork {
		// Paths without an epilogue: a second pass.
		switch {
		case k <= 0 && !acc:
			clear(c[:m*n])
		case k <= 0:
		case d.Sgemm != nil:
			d.Sgemm(max(d.Threads, 1), ta, tb, m, n, k, a, b, c, acc)
		default:
			d.gemmSplit(p, stop, ta, tb, m, n, k, a, b, c, acc, epilogue{})
		}
		if !Stopped(stop) {
			e.apply(c, m, n, n)
		}
		return
	}
	d.gemmSplit(p, stop, ta, tb, m, n, k, a, b, c, acc, e)
}

// Epilogue is what the GEMM does to each finished tile of c while it is
// still in cache: add Bias (a value per column; nil for none), then,
// with Gelu, replace each value by its gelu_tanh. The zero Epilogue does
// nothing.
type Epilogue struct {
	Bias []float32
	Gelu bool
}

// epilogue is an Epilogue with the path whose gelu kernels it runs.
type epilogue struct {
	bias []float32
	gelu bool
	path Path // the gelu kernels' width
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
	GeluForward(row, row, e.path)
}

// gemmSplit splits the larger of m and n across the GEMM's threads; the
// assembly paths add bias in their epilogue.
func (d *GEMM) gemmSplit(p Path, stop <-chan struct{}, ta, tb bool, m, n, k int, a, b, c []float32, acc bool, ep epilogue) {
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
	switch p {
	case PathAVX2:
		mr, nr = asmMR, asmNR
	case PathAVX512:
		mr, nr = zmmMR, zmmNR
	}
	minWork := d.MinWork
	if minWork <= 0 {
		minWork = MinWork
	}
	workers := min(max(d.Threads, 1), max(1, m*n*k/minWork))
	splitN := n >= m
	unit, units := mr, (m+mr-1)/mr
	if splitN {
		unit, units = nr, (n+nr-1)/nr
	}
	workers = min(workers, units)
	if workers <= 1 {
		d.gemmSerial(p, stop, ta, tb, m, n, k, a, lda, b, ldb, c, n, acc, ep)
		return
	}
	var wg Join
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
				d.gemmSerial(p, stop, ta, tb, m, hi-lo, k, a, lda, b[bo:], ldb, c[lo:], n, acc, ep.at(lo))
			} else {
				hi := min(hi, m)
				ao := lo * lda // row lo of op(A)
				if ta {
					ao = lo
				}
				d.gemmSerial(p, stop, ta, tb, hi-lo, n, k, a[ao:], lda, b, ldb, c[lo*n:], n, acc, ep)
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
func (d *GEMM) gemmSerial(p Path, stop <-chan struct{}, ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool, ep epilogue) {
	runtime.LockOSThread()
	bufs := d.getBufs()
	bufs.stop = stop
	defer func() {
		bufs.stop = nil
		d.putBufs(bufs)
		runtime.UnlockOSThread()
	}()
	if p != PathGo && !ta && tb && m <= dotMaxM {
		gemmDotSerial(p == PathAVX512, m, n, k, a, lda, b, ldb, c, ldc, acc, ep.bias)
		ep.bias = nil // added
		ep.apply(c, m, n, ldc)
		return
	}
	switch p {
	case PathAVX2:
		gemmSerialAsm(bufs, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc, ep)
		return
	case PathAVX512:
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
