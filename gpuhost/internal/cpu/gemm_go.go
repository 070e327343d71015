package cpu

// The portable GEMM kernel, for CPUs without AVX2 and FMA and for other
// architectures. Scalar Go keeps only 15 float registers usable on amd64; a
// 2×4 tile (8 accumulators) unrolled 4× in k is the largest that does not
// spill, and it runs at about 8–10 GFLOP/s on one Zen-class core.
const (
	goMR = 2
	goNR = 4
	goKU = 4    // k unroll of the micro-kernel; packed k is padded to it
	goKC = 256  // k depth of a block: a B panel (KC·NR floats) fits L1
	goMC = 128  // rows of an A block (MC·KC floats fit L2)
	goNC = 2048 // columns of a B block
)

// gemmSerialGo computes the m×n block of c at c[0] (row stride ldc) with
// the portable kernel.
func gemmSerialGo(bufs *gemmBufs, ta, tb bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool) {
	ap, bp := bufs.get(goMC*goKC, goNC*goKC)
	for jc := 0; jc < n; jc += goNC {
		nc := min(goNC, n-jc)
		for pc := 0; pc < k; pc += goKC {
			kc := min(goKC, k-pc)
			kp := (kc + goKU - 1) / goKU * goKU
			packBGo(bp, b, ldb, tb, pc, jc, kc, nc, kp)
			store := pc == 0 && !acc
			for ic := 0; ic < m; ic += goMC {
				if bufs.Stopped() {
					return
				}
				mc := min(goMC, m-ic)
				packAGo(ap, a, lda, ta, ic, pc, mc, kc, kp)
				macroKernelGo(mc, nc, kp, ap, bp, c[ic*ldc+jc:], ldc, store)
			}
		}
	}
}

// packAGo packs the mc×kc block of op(A) at (ic, pc) into MR-high panels,
// each laid out k-major (MR values per k) and zero-padded to MR rows and kp
// depth.
func packAGo(dst, a []float32, lda int, ta bool, ic, pc, mc, kc, kp int) {
	for ir := 0; ir < mc; ir += goMR {
		mr := min(goMR, mc-ir)
		p := dst[ir*kp : (ir+goMR)*kp]
		if mr < goMR || kc < kp {
			clear(p)
		}
		if ta {
			// op(A)(i, k) = a[k·lda + i]: each k gives mr adjacent values.
			for kk := range kc {
				src := a[(pc+kk)*lda+ic+ir:]
				src = src[:mr]
				q := p[kk*goMR : kk*goMR+mr]
				copy(q, src)
			}
			continue
		}
		for r := range mr {
			src := a[(ic+ir+r)*lda+pc:]
			src = src[:kc]
			for kk, v := range src {
				p[kk*goMR+r] = v
			}
		}
	}
}

// packBGo packs the kc×nc block of op(B) at (pc, jc) into NR-wide panels,
// each laid out k-major (NR values per k) and zero-padded to NR columns and
// kp depth.
func packBGo(dst, b []float32, ldb int, tb bool, pc, jc, kc, nc, kp int) {
	for jr := 0; jr < nc; jr += goNR {
		nr := min(goNR, nc-jr)
		p := dst[jr*kp : (jr+goNR)*kp]
		if nr < goNR || kc < kp {
			clear(p)
		}
		if tb {
			// op(B)(k, j) = b[j·ldb + k]: each column is a row of b.
			for cc := range nr {
				src := b[(jc+jr+cc)*ldb+pc:]
				src = src[:kc]
				for kk, v := range src {
					p[kk*goNR+cc] = v
				}
			}
			continue
		}
		if nr == goNR {
			for kk := range kc {
				src := (*[goNR]float32)(b[(pc+kk)*ldb+jc+jr:])
				*(*[goNR]float32)(p[kk*goNR:]) = *src
			}
			continue
		}
		for kk := range kc {
			copy(p[kk*goNR:kk*goNR+nr], b[(pc+kk)*ldb+jc+jr:])
		}
	}
}

// macroKernelGo multiplies a packed mc×kp A block by a packed kp×nc B block
// into c, storing on the first k block and adding afterwards.
func macroKernelGo(mc, nc, kp int, ap, bp, c []float32, ldc int, store bool) {
	var t [goMR * goNR]float32
	for jr := 0; jr < nc; jr += goNR {
		nr := min(goNR, nc-jr)
		bpan := bp[jr*kp : (jr+goNR)*kp]
		for ir := 0; ir < mc; ir += goMR {
			mr := min(goMR, mc-ir)
			microKernelGo(kp, ap[ir*kp:(ir+goMR)*kp], bpan, &t)
			if mr == goMR && nr == goNR {
				r0 := (*[goNR]float32)(c[ir*ldc+jr:])
				r1 := (*[goNR]float32)(c[(ir+1)*ldc+jr:])
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
						row[j] = t[r*goNR+j]
					} else {
						row[j] += t[r*goNR+j]
					}
				}
			}
		}
	}
}

// microKernelGo sets t to the 2×4 product of an A panel (2 values per k) and
// a B panel (4 values per k) over kp steps, kp a multiple of 4. The body is
// unrolled by hand: the compiler neither unrolls nor vectorises, and the
// array-pointer views drop the bounds checks.
func microKernelGo(kp int, a, b []float32, t *[goMR * goNR]float32) {
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	a = a[:goMR*kp]
	b = b[:goNR*kp]
	for p := 0; p+goKU <= kp; p += goKU {
		av := (*[goMR * goKU]float32)(a[goMR*p:])
		bv := (*[goNR * goKU]float32)(b[goNR*p:])
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
