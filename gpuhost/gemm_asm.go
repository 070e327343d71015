package gpuhost

// The AVX2/FMA path: a 6×16 register tile (12 YMM accumulators, two YMM
// loads of B and six broadcasts of A per k) and BLIS-style blocking for
// Zen-class cores. A B panel (KC·NR floats, 16 KB) stays in L1 while the
// micro-kernel walks the MC×KC A block (144 KB) in L2; the KC×NC B block
// streams from L3. Panels of a B block are 64 bytes apart: at exactly
// 16 KB spacing, consecutive panels fell into the same cache sets.
const (
	asmMR   = 6
	asmNR   = 16
	asmKC   = 256
	asmMC   = 144
	asmNC   = 4096
	asmBPad = 16 // floats between B panels

	// asmFuseNC is the number of columns of B that the first A block
	// packs and uses at once (8 panels, 128 KB at KC=256).
	asmFuseNC = 128

	// asmShallowKC is the k depth below which the macro-kernel walks c
	// by rows of tiles rather than by columns.
	asmShallowKC = 32
)

// gemmSerialAsm computes the m×n block of c at c[0] (row stride ldc) with
// the assembly micro-kernel.
func gemmSerialAsm(bufs *gemmBufs, ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	// Even k blocks: k = 300 runs as 150+150, not 256+44.
	kBlocks := (k + asmKC - 1) / asmKC
	kcMax := (k + kBlocks - 1) / kBlocks
	ncMax := (min(asmNC, n) + asmNR - 1) / asmNR * asmNR
	mcMax := (min(asmMC, m) + asmMR - 1) / asmMR * asmMR
	ap, bp := bufs.get(mcMax*kcMax, ncMax/asmNR*(kcMax*asmNR+asmBPad))
	var t [asmMR * asmNR]float32
	bs := kcMax*asmNR + asmBPad
	for jc := 0; jc < n; jc += asmNC {
		nc := min(asmNC, n-jc)
		for pc := 0; pc < k; pc += kcMax {
			kc := min(kcMax, k-pc)
			add := acc || pc > 0
			for ic := 0; ic < m; ic += asmMC {
				if bufs.stopped() {
					return
				}
				mc := min(asmMC, m-ic)
				packAAsm(ap, a, lda, ta, ic, pc, mc, kc)
				cb := c[ic*ldc+jc:]
				if ic > 0 {
					macroKernelAsm(mc, nc, kc, bs, ap, bp, cb, ldc, add, &t)
					continue
				}
				// The first A block packs B a few panels at a time, just
				// before it uses them, while they are still in L2: for
				// m ≤ MC, packed B never goes back to memory.
				for jr := 0; jr < nc; jr += asmFuseNC {
					nr := min(asmFuseNC, nc-jr)
					pan := bp[jr/asmNR*bs:]
					packBAsm(pan, b, ldb, tb, pc, jc+jr, kc, nr, bs)
					macroKernelAsm(mc, nr, kc, bs, ap, pan, cb[jr:], ldc, add, &t)
				}
			}
		}
	}
}

// packAAsm packs the mc×kc block of op(A) at (ic, pc) into 6-high panels,
// each laid out k-major (6 values per k) and zero-padded to 6 rows.
func packAAsm(dst, a []float32, lda int, ta bool, ic, pc, mc, kc int) {
	for ir := 0; ir < mc; ir += asmMR {
		mr := min(asmMR, mc-ir)
		p := dst[ir*kc : (ir+asmMR)*kc]
		switch {
		case ta && mr == asmMR:
			// op(A)(i, k) = a[k·lda + i]: each k gives 6 adjacent values.
			for kk := range kc {
				*(*[asmMR]float32)(p[kk*asmMR:]) = *(*[asmMR]float32)(a[(pc+kk)*lda+ic+ir:])
			}
		case ta:
			for kk := range kc {
				q := p[kk*asmMR : (kk+1)*asmMR]
				clear(q[copy(q, a[(pc+kk)*lda+ic+ir:][:mr]):])
			}
		case mr == asmMR:
			base := (ic+ir)*lda + pc
			r0 := a[base:][:kc]
			r1 := a[base+lda:][:kc]
			r2 := a[base+2*lda:][:kc]
			r3 := a[base+3*lda:][:kc]
			r4 := a[base+4*lda:][:kc]
			r5 := a[base+5*lda:][:kc]
			for kk := range kc {
				q := (*[asmMR]float32)(p[kk*asmMR:])
				q[0], q[1], q[2], q[3], q[4], q[5] = r0[kk], r1[kk], r2[kk], r3[kk], r4[kk], r5[kk]
			}
		default:
			clear(p)
			for r := range mr {
				src := a[(ic+ir+r)*lda+pc:][:kc]
				for kk, v := range src {
					p[kk*asmMR+r] = v
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

// macroKernelAsm multiplies a packed mc×kc A block by a packed kc×nc B
// block (panels bs floats apart) into c, storing or, when add is set, adding. Edge tiles go
// through t.
func macroKernelAsm(mc, nc, kc, bs int, ap, bp, c []float32, ldc int, add bool, t *[asmMR * asmNR]float32) {
	if kc < asmShallowKC {
		// Little arithmetic per tile: walk c row-wise, so that its
		// stores stream instead of striding down a column of tiles.
		for ir := 0; ir < mc; ir += asmMR {
			for jr := 0; jr < nc; jr += asmNR {
				tileAsm(ir, jr, mc, nc, kc, bs, ap, bp, c, ldc, add, t)
			}
		}
		return
	}
	for jr := 0; jr < nc; jr += asmNR {
		for ir := 0; ir < mc; ir += asmMR {
			tileAsm(ir, jr, mc, nc, kc, bs, ap, bp, c, ldc, add, t)
		}
	}
}

// tileAsm computes the tile of c at (ir, jr) from the A panel at row ir and
// the B panel at column jr; edge tiles go through t.
func tileAsm(ir, jr, mc, nc, kc, bs int, ap, bp, c []float32, ldc int, add bool, t *[asmMR * asmNR]float32) {
	nr := min(asmNR, nc-jr)
	mr := min(asmMR, mc-ir)
	bpan := bp[jr/asmNR*bs:][:kc*asmNR]
	apan := ap[ir*kc:][:kc*asmMR]
	if mr == asmMR && nr == asmNR {
		// The slice proves that the whole tile is inside c.
		tile := c[ir*ldc+jr:][:(asmMR-1)*ldc+asmNR]
		gemmKernel6x16(kc, &apan[0], &bpan[0], &tile[0], ldc, add)
		return
	}
	gemmKernel6x16(kc, &apan[0], &bpan[0], &t[0], asmNR, false)
	for r := range mr {
		row := c[(ir+r)*ldc+jr:][:nr]
		tr := t[r*asmNR:][:nr]
		if !add {
			copy(row, tr)
			continue
		}
		for j, v := range tr {
			row[j] += v
		}
	}
}
