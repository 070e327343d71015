package gpuhost

import "sync"

// The CPU GEMM follows Goto's scheme: op(B) is packed into KC×NC blocks of
// NR-wide column panels, op(A) into MC×KC blocks of MR-high row panels, and
// a register-blocked micro-kernel multiplies one A panel by one B panel.
// Packing absorbs the transposes, so every variant runs the same unit-stride
// micro-kernel. Scalar Go keeps only 15 float registers usable on amd64; a
// 2×4 tile (8 accumulators) unrolled 4× in k is the largest that does not
// spill, and it runs at about 8–10 GFLOP/s on one Zen-class core. An assembly kernel will
// replace it.
const (
	gemmMR = 2
	gemmNR = 4
	gemmKU = 4    // k unroll of the micro-kernel; packed k is padded to it
	gemmKC = 256  // k depth of a block: a B panel (KC·NR floats) fits L1
	gemmMC = 128  // rows of an A block (MC·KC floats fit L2)
	gemmNC = 2048 // columns of a B block

	// gemmMinWork is the number of multiply-adds below which a second
	// goroutine costs more than it saves.
	gemmMinWork = 1 << 17
)

// gemmBufs are one worker's packing buffers.
type gemmBufs struct {
	a, b []float32
}

// getBufs returns packing buffers from the device's pool, so that
// concurrent calls never share scratch.
func (d *cpuDevice) getBufs() *gemmBufs {
	if g, ok := d.packs.Get().(*gemmBufs); ok {
		return g
	}
	return &gemmBufs{
		a: make([]float32, gemmMC*gemmKC),
		b: make([]float32, gemmNC*gemmKC),
	}
}

// gemm implements kernels.gemm.
func (d *cpuDevice) gemm(ta, tb bool, m, n, k int, a, b, c *Tensor, acc bool) error {
	d.gemmF32(ta, tb, m, n, k, a.f32(), b.f32(), c.f32(), acc)
	return nil
}

// gemmF32 computes c (+)= op(a)·op(b) on slices, splitting the larger of m
// and n across the device's threads.
func (d *cpuDevice) gemmF32(ta, tb bool, m, n, k int, a, b, c []float32, acc bool) {
	if m <= 0 || n <= 0 {
		return
	}
	if k <= 0 {
		if !acc {
			clear(c[:m*n])
		}
		return
	}
	lda, ldb := k, n
	if ta {
		lda = m
	}
	if tb {
		ldb = k
	}
	workers := min(d.threads, max(1, m*n*k/max(d.minWork, 1)))
	splitN := n >= m
	unit, units := gemmMR, (m+gemmMR-1)/gemmMR
	if splitN {
		unit, units = gemmNR, (n+gemmNR-1)/gemmNR
	}
	workers = min(workers, units)
	if workers <= 1 {
		d.gemmSerial(ta, tb, m, n, k, a, lda, b, ldb, c, n, acc)
		return
	}
	var wg sync.WaitGroup
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
				d.gemmSerial(ta, tb, m, hi-lo, k, a, lda, b[bo:], ldb, c[lo:], n, acc)
			} else {
				hi := min(hi, m)
				ao := lo * lda // row lo of op(A)
				if ta {
					ao = lo
				}
				d.gemmSerial(ta, tb, hi-lo, n, k, a[ao:], lda, b, ldb, c[lo*n:], n, acc)
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
// calling goroutine.
func (d *cpuDevice) gemmSerial(ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	bufs := d.getBufs()
	defer d.packs.Put(bufs)
	for jc := 0; jc < n; jc += gemmNC {
		nc := min(gemmNC, n-jc)
		for pc := 0; pc < k; pc += gemmKC {
			kc := min(gemmKC, k-pc)
			kp := (kc + gemmKU - 1) / gemmKU * gemmKU
			packB(bufs.b, b, ldb, tb, pc, jc, kc, nc, kp)
			store := pc == 0 && !acc
			for ic := 0; ic < m; ic += gemmMC {
				mc := min(gemmMC, m-ic)
				packA(bufs.a, a, lda, ta, ic, pc, mc, kc, kp)
				macroKernel(mc, nc, kp, bufs.a, bufs.b, c[ic*ldc+jc:], ldc, store)
			}
		}
	}
}

// packA packs the mc×kc block of op(A) at (ic, pc) into MR-high panels,
// each laid out k-major (MR values per k) and zero-padded to MR rows and kp
// depth.
func packA(dst, a []float32, lda int, ta bool, ic, pc, mc, kc, kp int) {
	for ir := 0; ir < mc; ir += gemmMR {
		mr := min(gemmMR, mc-ir)
		p := dst[ir*kp : (ir+gemmMR)*kp]
		if mr < gemmMR || kc < kp {
			clear(p)
		}
		if ta {
			// op(A)(i, k) = a[k·lda + i]: each k gives mr adjacent values.
			for kk := range kc {
				src := a[(pc+kk)*lda+ic+ir:]
				src = src[:mr]
				q := p[kk*gemmMR : kk*gemmMR+mr]
				copy(q, src)
			}
			continue
		}
		for r := range mr {
			src := a[(ic+ir+r)*lda+pc:]
			src = src[:kc]
			for kk, v := range src {
				p[kk*gemmMR+r] = v
			}
		}
	}
}

// packB packs the kc×nc block of op(B) at (pc, jc) into NR-wide panels,
// each laid out k-major (NR values per k) and zero-padded to NR columns and
// kp depth.
func packB(dst, b []float32, ldb int, tb bool, pc, jc, kc, nc, kp int) {
	for jr := 0; jr < nc; jr += gemmNR {
		nr := min(gemmNR, nc-jr)
		p := dst[jr*kp : (jr+gemmNR)*kp]
		if nr < gemmNR || kc < kp {
			clear(p)
		}
		if tb {
			// op(B)(k, j) = b[j·ldb + k]: each column is a row of b.
			for cc := range nr {
				src := b[(jc+jr+cc)*ldb+pc:]
				src = src[:kc]
				for kk, v := range src {
					p[kk*gemmNR+cc] = v
				}
			}
			continue
		}
		if nr == gemmNR {
			for kk := range kc {
				src := (*[gemmNR]float32)(b[(pc+kk)*ldb+jc+jr:])
				*(*[gemmNR]float32)(p[kk*gemmNR:]) = *src
			}
			continue
		}
		for kk := range kc {
			copy(p[kk*gemmNR:kk*gemmNR+nr], b[(pc+kk)*ldb+jc+jr:])
		}
	}
}

// macroKernel multiplies a packed mc×kp A block by a packed kp×nc B block
// into c, storing on the first k block and adding afterwards.
func macroKernel(mc, nc, kp int, ap, bp, c []float32, ldc int, store bool) {
	var t [gemmMR * gemmNR]float32
	for jr := 0; jr < nc; jr += gemmNR {
		nr := min(gemmNR, nc-jr)
		bpan := bp[jr*kp : (jr+gemmNR)*kp]
		for ir := 0; ir < mc; ir += gemmMR {
			mr := min(gemmMR, mc-ir)
			microKernel(kp, ap[ir*kp:(ir+gemmMR)*kp], bpan, &t)
			if mr == gemmMR && nr == gemmNR {
				r0 := (*[gemmNR]float32)(c[ir*ldc+jr:])
				r1 := (*[gemmNR]float32)(c[(ir+1)*ldc+jr:])
				if store {
					r0[0], r0[1], r0[2], r0[3] = t[0], t[1], t[2], t[3]
					r1[0], r1[1], r1[2], r1[3] = t[4], t[5], t[6], t[7]
				} else {
					r0[0] += t[0]
					r0[1] += t[1]
					r0[2] += t[2]
					r0[3] += t[3]
					r1[0] += t[4]
					r1[1] += t[5]
					r1[2] += t[6]
					r1[3] += t[7]
				}
				continue
			}
			for r := range mr {
				row := c[(ir+r)*ldc+jr:]
				row = row[:nr]
				for j := range row {
					if store {
						row[j] = t[r*gemmNR+j]
					} else {
						row[j] += t[r*gemmNR+j]
					}
				}
			}
		}
	}
}

// microKernel sets t to the 2×4 product of an A panel (2 values per k) and
// a B panel (4 values per k) over kp steps, kp a multiple of 4. The body is
// unrolled by hand: the compiler neither unrolls nor vectorises, and the
// array-pointer views drop the bounds checks.
func microKernel(kp int, a, b []float32, t *[gemmMR * gemmNR]float32) {
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	a = a[:gemmMR*kp]
	b = b[:gemmNR*kp]
	for p := 0; p+gemmKU <= kp; p += gemmKU {
		av := (*[gemmMR * gemmKU]float32)(a[gemmMR*p:])
		bv := (*[gemmNR * gemmKU]float32)(b[gemmNR*p:])
		a0, a1 := av[0], av[1]
		c00 += a0 * bv[0]
		c01 += a0 * bv[1]
		c02 += a0 * bv[2]
		c03 += a0 * bv[3]
		c10 += a1 * bv[0]
		c11 += a1 * bv[1]
		c12 += a1 * bv[2]
		c13 += a1 * bv[3]
		a0, a1 = av[2], av[3]
		c00 += a0 * bv[4]
		c01 += a0 * bv[5]
		c02 += a0 * bv[6]
		c03 += a0 * bv[7]
		c10 += a1 * bv[4]
		c11 += a1 * bv[5]
		c12 += a1 * bv[6]
		c13 += a1 * bv[7]
		a0, a1 = av[4], av[5]
		c00 += a0 * bv[8]
		c01 += a0 * bv[9]
		c02 += a0 * bv[10]
		c03 += a0 * bv[11]
		c10 += a1 * bv[8]
		c11 += a1 * bv[9]
		c12 += a1 * bv[10]
		c13 += a1 * bv[11]
		a0, a1 = av[6], av[7]
		c00 += a0 * bv[12]
		c01 += a0 * bv[13]
		c02 += a0 * bv[14]
		c03 += a0 * bv[15]
		c10 += a1 * bv[12]
		c11 += a1 * bv[13]
		c12 += a1 * bv[14]
		c13 += a1 * bv[15]
	}
	t[0], t[1], t[2], t[3] = c00, c01, c02, c03
	t[4], t[5], t[6], t[7] = c10, c11, c12, c13
}
