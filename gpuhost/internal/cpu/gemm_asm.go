package cpu

import "sync"

// The assembly paths: a register tile (6×16 on AVX2, 12 YMM accumulators;
// 14×32 on AVX-512, 28 ZMM accumulators) and BLIS-style blocking sized from
// the machine's caches (blockingFor). A B panel (KC·NR floats) stays in L1
// while the micro-kernel walks the MC×KC A block in L2; the KC×NC B block
// streams from L3. B is packed in 16-wide panels whatever NR is (the
// 32-wide kernel reads two), and panels are 64 bytes more than their size
// apart: at exactly 16 KB spacing, consecutive panels fell into the same
// cache sets.
const (
	asmMR   = 6
	asmNR   = 16
	zmmMR   = 14
	zmmNR   = 32
	asmBPad = 16 // floats between B panels

	// asmShallowKC is the k depth below which the macro-kernel walks c
	// by rows of tiles rather than by columns.
	asmShallowKC = 32

	// asmMaxTile bounds mr·nr of every kernel, for the edge-tile buffer.
	asmMaxTile = zmmMR * zmmNR
)

// asmKernel is a micro-kernel with its blocking.
type asmKernel struct {
	mr, nr int
	gemmBlocking
	// fn computes the mr×nr tile of a packed A panel by packed B (16-wide
	// panels bs floats apart) over kc, stores it into c (row stride ldc)
	// or adds it when add is set, and then adds bias[0:nr] to each row
	// unless bias is nil.
	// It does so for panels consecutive A panels, down a column of c.
	fn func(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, panels int)
	// edge is fn for the top rows rows (0 < rows < mr) of one mr-high
	// A panel: an edge tile of m goes straight into c.
	edge func(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, rows int)
}

var (
	avx2Kernel = sync.OnceValue(func() *asmKernel {
		return &asmKernel{mr: asmMR, nr: asmNR, gemmBlocking: blockingFor(machineCaches(), asmMR, asmNR), fn: gemmKernel6x16,
			edge: gemmEdge6x16}
	})
	avx512Kernel = sync.OnceValue(func() *asmKernel {
		return &asmKernel{mr: zmmMR, nr: zmmNR, gemmBlocking: blockingFor(machineCaches(), zmmMR, zmmNR), fn: gemmKernel14x32,
			edge: gemmEdge14x32}
	})
)

// gemmSerialAsm computes the m×n block of c at c[0] (row stride ldc) with
// the AVX2 micro-kernel.
func gemmSerialAsm(bufs *gemmBufs, ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool, ep epilogue) {
	avx2Kernel().serial(bufs, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc, ep)
}

// gemmSerialZmm is gemmSerialAsm with the AVX-512 micro-kernel.
func gemmSerialZmm(bufs *gemmBufs, ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool, ep epilogue) {
	avx512Kernel().serial(bufs, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, acc, ep)
}

// serial computes the m×n block of c at c[0] (row stride ldc) and runs ep
// on each block of c once its last k block is done.
func (kn *asmKernel) serial(bufs *gemmBufs, ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool, ep epilogue) {
	mr, nr := kn.mr, kn.nr
	// Even k blocks: k = 300 runs as 150+150, not 256+44. Even m blocks
	// too: m = 256 runs as 132+124, not 168+88, and never ends in a
	// sliver that streams all of packed B for a few rows.
	kBlocks := (k + kn.kc - 1) / kn.kc
	kcMax := (k + kBlocks - 1) / kBlocks
	ncMax := (min(kn.nc, n) + nr - 1) / nr * nr
	mBlocks := (m + kn.mc - 1) / kn.mc
	if m <= kn.oneMC {
		// All of A fits in half of L2: one A block, so that each few
		// packed B panels are used at once by every row and then
		// overwritten, and packed B never leaves L2 (see below).
		mBlocks = 1
	}
	mcMax := ((m+mBlocks-1)/mBlocks + mr - 1) / mr * mr
	bs := kcMax*asmNR + asmBPad
	// One panel of slack: a 32-wide tile at the right edge reads a
	// second panel that packing did not fill.
	ap, bp := bufs.get(mcMax*kcMax, (ncMax/asmNR+1)*bs)
	var t [asmMaxTile]float32
	// The first A block packs B fuse columns at a time and, for a
	// row-major b, prefetches the next chunk while it multiplies this
	// one, if the A block and two chunks fit in L2. (Narrower chunks, so
	// that m = 256 could prefetch too, measured 3% slower there. A
	// transposed b's next rows of W prefetched alike measured 1–3%
	// slower on Zen 5.)
	fuse := kn.fuseNC
	prefetch := !tb && mcMax*kcMax+2*kcMax*fuse <= kn.pfL2
	for jc := 0; jc < n; jc += kn.nc {
		nc := min(kn.nc, n-jc)
		for pc := 0; pc < k; pc += kcMax {
			kc := min(kcMax, k-pc)
			add := acc || pc > 0
			var eb epilogue // only once the sums are whole
			if pc+kc == k {
				eb = ep.at(jc)
			}
			for ic := 0; ic < m; ic += mcMax {
				if bufs.Stopped() {
					return
				}
				mc := min(mcMax, m-ic)
				packAAsm(ap, a, lda, ta, ic, pc, mc, kc, mr)
				cb := c[ic*ldc+jc:]
				if ic > 0 {
					kn.macro(mc, nc, kc, bs, ap, bp, cb, ldc, add, eb, &t, nil)
					continue
				}
				// The first A block packs B a few panels at a time, just
				// before it uses them, while they are still in L2. With
				// one A block they are packed into the same few KiB each
				// time, which stay in L2: packing B, the larger part of
				// the cost at small m, then only reads b.
				for jr := 0; jr < nc; jr += fuse {
					w := min(fuse, nc-jr)
					pan := bp
					if m > mcMax {
						pan = bp[jr/asmNR*bs:] // kept for the next A blocks
					}
					packBAsm(pan, b, ldb, tb, pc, jc+jr, kc, w, bs)
					// While this chunk is multiplied, the next one to be
					// packed is brought into L2 (see nextChunk).
					pf := nextChunk(!prefetch, m > mcMax, fuse, n, k, kcMax, jc, nc, pc, jr, b, ldb)
					// The activation runs over this block's rows once it
					// is done, while it is still in L2: rows of up to
					// fuseNC values, rather than 16 at a time per tile.
					ej := eb.at(jr)
					kn.macro(mc, w, kc, bs, ap, pan, cb[jr:], ldc, add, epilogue{bias: ej.bias}, &t, &pf)
					if ej.gelu {
						for r := range mc {
							ej.activate(cb[r*ldc+jr:][:w])
						}
					}
				}
			}
		}
	}
}

// packAAsm packs the mc×kc block of op(A) at (ic, pc) into mr-high panels,
// each laid out k-major (mr values per k) and zero-padded to mr rows.
func packAAsm(dst, a []float32, lda int, ta bool, ic, pc, mc, kc, mr int) {
	for ir := 0; ir < mc; ir += mr {
		rows := min(mr, mc-ir)
		p := dst[ir*kc : (ir+mr)*kc]
		switch {
		case ta && rows == mr:
			// op(A)(i, k) = a[k·lda + i]: each k gives mr adjacent values.
			for kk := range kc {
				copy(p[kk*mr:(kk+1)*mr], a[(pc+kk)*lda+ic+ir:])
			}
		case ta:
			for kk := range kc {
				q := p[kk*mr : (kk+1)*mr]
				clear(q[copy(q, a[(pc+kk)*lda+ic+ir:][:rows]):])
			}
		case rows == asmMR && mr == asmMR:
			base := (ic+ir)*lda + pc
			r0 := a[base:][:kc]
			r1 := a[base+lda:][:kc]
			r2 := a[base+2*lda:][:kc]
			r3 := a[base+3*lda:][:kc]
			r4 := a[base+4*lda:][:kc]
			r5 := a[base+5*lda:][:kc]
			// 8 k at a time by transposes; at least one k is left to
			// the loop below, which overwrites the two values the
			// assembly writes past its last group.
			g := 0
			if gemmHaveAsm && gemmAB&8 == 0 {
				g = (kc - 1) / 8
			}
			if g > 0 {
				_ = r5[8*g-1] // the assembly reads within a and p
				_ = p[48*g+1]
				packA6x8(g, &r0[0], lda, &p[0])
			}
			for kk := 8 * g; kk < kc; kk++ {
				q := (*[asmMR]float32)(p[kk*asmMR:])
				q[0], q[1], q[2], q[3], q[4], q[5] = r0[kk], r1[kk], r2[kk], r3[kk], r4[kk], r5[kk]
			}
		case rows == zmmMR && mr == zmmMR && gemmHaveAsm && gemmAB&8 == 0 && kc > 8:
			// As the 6-row case: 8 k at a time, the rest below.
			src := a[(ic+ir)*lda+pc:]
			g := (kc - 1) / 8
			_ = src[(zmmMR-1)*lda+8*g-1] // the assembly reads within a and p
			_ = p[112*g+1]
			packA14x8(g, &src[0], lda, &p[0])
			for r := range zmmMR {
				s := src[r*lda:][:kc]
				for kk := 8 * g; kk < kc; kk++ {
					p[kk*zmmMR+r] = s[kk]
				}
			}
		case rows == mr && mr%2 == 0:
			// Two rows at a time: mr/2 passes over a's rows.
			for r := 0; r < mr; r += 2 {
				s0 := a[(ic+ir+r)*lda+pc:][:kc]
				s1 := a[(ic+ir+r+1)*lda+pc:][:kc]
				for kk := range kc {
					q := (*[2]float32)(p[kk*mr+r:])
					q[0], q[1] = s0[kk], s1[kk]
				}
			}
		default:
			clear(p)
			for r := range rows {
				src := a[(ic+ir+r)*lda+pc:][:kc]
				for kk, v := range src {
					p[kk*mr+r] = v
				}
			}
		}
	}
}

// packBAsm packs the kc×nc block of op(B) at (pc, jc) into 16-wide panels
// bs floats apart, each laid out k-major (16 values per k) and zero-padded
// to 16 columns.
func packBAsm(dst, b []float32, ldb int, tb bool, pc, jc, kc, nc, bs int) {
	if tb {
		// op(B)(k, j) = b[j·ldb + k]: each column is a row of b.
		for jr := 0; jr < nc; jr += asmNR {
			packBTrans(dst[jr/asmNR*bs:][:kc*asmNR], b[(jc+jr)*ldb+pc:], ldb, kc, min(asmNR, nc-jr))
		}
		return
	}
	// Row by row, so that b streams through memory: a panel at a time
	// would touch a new page of a wide b for every k.
	full := nc / asmNR
	if full > 0 {
		src := b[pc*ldb+jc:]
		_ = src[(kc-1)*ldb+full*asmNR-1] // the assembly reads within b and dst
		_ = dst[(full-1)*bs+kc*asmNR-1]
		packBRows16(kc, &src[0], ldb, &dst[0], full, bs)
	}
	if nr := nc - full*asmNR; nr > 0 {
		p := dst[full*bs:][:kc*asmNR]
		for kk := range kc {
			q := p[kk*asmNR : (kk+1)*asmNR]
			clear(q[copy(q, b[(pc+kk)*ldb+jc+full*asmNR:][:nr]):])
		}
	}
}

// packBTrans transposes nr ≤ 16 rows of b (row stride ldb, kc values
// each) into the k-major panel p, zero-padding missing columns.
func packBTrans(p, b []float32, ldb, kc, nr int) {
	if nr == asmNR {
		g := kc / 8
		if g > 0 {
			_ = b[(asmNR-1)*ldb+8*g-1] // the assembly reads within b and p
			_ = p[8*g*asmNR-1]
			packBTrans16(g, &b[0], ldb, &p[0])
		}
		for kk := 8 * g; kk < kc; kk++ {
			q := (*[asmNR]float32)(p[kk*asmNR:])
			for cc := range q {
				q[cc] = b[cc*ldb+kk]
			}
		}
		return
	}
	clear(p)
	cc := 0
	for ; cc+4 <= nr; cc += 4 {
		s0 := b[cc*ldb:][:kc]
		s1 := b[(cc+1)*ldb:][:kc]
		s2 := b[(cc+2)*ldb:][:kc]
		s3 := b[(cc+3)*ldb:][:kc]
		for kk := range kc {
			q := (*[4]float32)(p[kk*asmNR+cc:])
			q[0], q[1], q[2], q[3] = s0[kk], s1[kk], s2[kk], s3[kk]
		}
	}
	for ; cc < nr; cc++ {
		for kk, v := range b[cc*ldb:][:kc] {
			p[kk*asmNR+cc] = v
		}
	}
}

// macro multiplies a packed mc×kc A block by a packed kc×nc B block
// (16-wide panels bs floats apart) into c, storing or, when add is set,
// adding, and then running ep on each tile. Edge tiles go through t.
func (kn *asmKernel) macro(mc, nc, kc, bs int, ap, bp, c []float32, ldc int, add bool, ep epilogue, t *[asmMaxTile]float32, pf *bPrefetch) {
	if kc < asmShallowKC {
		// Little arithmetic per tile: walk c row-wise, so that its
		// stores stream instead of striding down a column of tiles.
		for ir := 0; ir < mc; ir += kn.mr {
			for jr := 0; jr < nc; jr += kn.nr {
				kn.tile(ir, jr, mc, nc, kc, bs, ap, bp, c, ldc, add, ep, t)
			}
		}
		return
	}
	share := 0
	if pf != nil && pf.rows > 0 {
		tiles := (nc + kn.nr - 1) / kn.nr * ((mc + kn.mr - 1) / kn.mr)
		share = (pf.rows + tiles - 1) / tiles
	}
	full := mc / kn.mr
	for jr := 0; jr < nc; jr += kn.nr {
		ir := 0
		if nc-jr >= kn.nr && gemmAB&64 == 0 {
			// Whole tiles down the column in one call (1–2% faster
			// at m = 256), but one at a time while prefetching: three
			// at a time, with the prefetches in bursts, measured 2%
			// slower at m = 64.
			for ir < full*kn.mr {
				g := full - ir/kn.mr
				if share > 0 {
					g = 1
				}
				kn.column(ir, jr, g, g*kn.mr, kc, bs, ap, bp, c, ldc, add, ep)
				ir += g * kn.mr
				if share > 0 {
					pf.next(g * share)
				}
			}
		}
		for ; ir < mc; ir += kn.mr {
			kn.tile(ir, jr, mc, nc, kc, bs, ap, bp, c, ldc, add, ep, t)
			if share > 0 {
				pf.next(share)
			}
		}
	}
}

// column computes the full-width tiles of c down the column at (ir, jr)
// from g consecutive A panels, straight into c, in one call of the
// micro-kernel: rows is g·mr, or fewer for an edge tile (g = 1), which
// the edge kernel computes. The kernel adds the bias; an activation then
// runs on the tiles' rows while they are in L1.
func (kn *asmKernel) column(ir, jr, g, rows, kc, bs int, ap, bp, c []float32, ldc int, add bool, ep epilogue) {
	mr, nr := kn.mr, kn.nr
	// The slices prove that the kernel stays inside c, A and B.
	tile := c[ir*ldc+jr:][:(rows-1)*ldc+nr]
	apan := ap[ir*kc:][:g*mr*kc]
	bpan := bp[jr/asmNR*bs:][:(nr/asmNR-1)*bs+kc*asmNR]
	var bv *float32
	if ep.bias != nil {
		bv = &ep.bias[jr:][:nr][0]
	}
	if rows == g*mr {
		kn.fn(kc, &apan[0], &bpan[0], &tile[0], ldc, bs, bv, add, g)
	} else {
		kn.edge(kc, &apan[0], &bpan[0], &tile[0], ldc, bs, bv, add, rows)
	}
	if ep.gelu {
		for r := range rows {
			ep.activate(c[(ir+r)*ldc+jr:][:nr])
		}
	}
}

// bPrefetch is a block of a row-major B (rows rows of lines cache lines,
// row stride ldb floats) to be prefetched a few rows at a time.
type bPrefetch struct {
	src              []float32
	ldb, rows, lines int
}

// gemmAB switches this file's optimisations off one by one, for A/B runs
// of old against new code in one process (TestGemmAB): bit 0 the prefetch
// of the next B chunk, bit 1 the edge kernels, bit 3 the
// assembly A packing, bit 6 the multi-tile kernel calls, bit 7 the dot
// kernels that store their tiles (gemmDotTiles3x4), bit 8 their 1- and
// 2-row kernels. Zero in
// production.
var gemmAB int

// next prefetches up to n more rows.
func (pf *bPrefetch) next(n int) {
	n = min(n, pf.rows)
	if n <= 0 {
		return
	}
	_ = pf.src[(n-1)*pf.ldb+pf.lines*16-1] // prefetch stays within b
	prefetchRows16(n, &pf.src[0], pf.ldb, pf.lines)
	pf.rows -= n
	if pf.rows > 0 {
		pf.src = pf.src[n*pf.ldb:]
	}
}

// nextChunk returns the block of a row-major b that the first A block
// packs after the chunk at (pc, jc+jr), fuse columns wide, for the
// macro-kernel to prefetch while it multiplies this one: each row of a
// wide b is a new 4 KiB page, which the hardware prefetchers do not
// follow, so the packing alone waited on memory for most of its reads.
// None when skip is set, nor after the last chunk of a k block when later
// A blocks come first.
func nextChunk(skip, manyA bool, fuse, n, k, kcMax, jc, nc, pc, jr int, b []float32, ldb int) bPrefetch {
	if skip || gemmAB&1 != 0 {
		return bPrefetch{}
	}
	pc2, col, w := pc, jc+jr+fuse, 0
	switch {
	case jr+fuse < nc:
		w = min(fuse, nc-jr-fuse)
	case manyA:
		return bPrefetch{}
	case pc+kcMax < k:
		pc2, col, w = pc+kcMax, jc, min(fuse, nc)
	case jc+nc < n:
		pc2, col, w = 0, jc+nc, min(fuse, n-jc-nc)
	default:
		return bPrefetch{}
	}
	rows := min(kcMax, k-pc2)
	lines := w / 16 // whole lines within b: a ragged end is a few floats
	if lines == 0 {
		return bPrefetch{}
	}
	return bPrefetch{src: b[pc2*ldb+col:], ldb: ldb, rows: rows, lines: lines}
}

// tile computes the tile of c at (ir, jr) from the A panel at row ir and
// the B panels from column jr: a full-width one straight into c (column),
// a narrower one through t.
func (kn *asmKernel) tile(ir, jr, mc, nc, kc, bs int, ap, bp, c []float32, ldc int, add bool, ep epilogue, t *[asmMaxTile]float32) {
	bias := ep.bias
	mr, nr := kn.mr, kn.nr
	w := min(nr, nc-jr)
	rows := min(mr, mc-ir)
	if w == nr && (rows == mr || kn.edge != nil && gemmAB&2 == 0) {
		kn.column(ir, jr, 1, rows, kc, bs, ap, bp, c, ldc, add, ep)
		return
	}
	// The kernel reads nr/16 panels from here; the buffer has one of
	// slack past the last packed panel (serial).
	bpan := bp[jr/asmNR*bs:][:(nr/asmNR-1)*bs+kc*asmNR]
	apan := ap[ir*kc:][:kc*mr]
	kn.fn(kc, &apan[0], &bpan[0], &t[0], nr, bs, nil, false, 1)
	for r := range rows {
		row := c[(ir+r)*ldc+jr:][:w]
		tr := t[r*nr:][:w]
		switch {
		case add && bias != nil:
			bb := bias[jr:][:w]
			for j, v := range tr {
				row[j] = row[j] + v + bb[j]
			}
		case add:
			for j, v := range tr {
				row[j] += v
			}
		case bias != nil:
			bb := bias[jr:][:w]
			for j, v := range tr {
				row[j] = v + bb[j]
			}
		default:
			copy(row, tr)
		}
		ep.activate(row)
	}
}
