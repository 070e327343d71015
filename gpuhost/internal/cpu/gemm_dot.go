package cpu

// dotMaxM is the most rows of x for which x·Wᵀ runs as dot products
// (gemmDotSerial) rather than through packing: packing transposes all of
// W, which costs more than a few rows of arithmetic. A batch of one-row
// requests is such a product. Measured on a Zen 3 core at n=4096, k=1024
// in GFLOP per CPU-second, dot against packed: 3.2/1.0 at 1 row, 22/12 at
// 12, 34/22 at 24, 42/35 at 48.
const dotMaxM = 48

// dotBlockN is how many rows of W one pass keeps hot while every row of x
// is dotted with them; dotBlockN512 is the same for gemmDot4x6, a multiple
// of its 6 rows of W.
const (
	dotBlockN    = 16
	dotBlockN512 = 24
)

// gemmDotSerial computes the m×n block of c (row stride ldc) as
// op(a)·bᵀ, op(a) = a (m×k, row stride lda) and b n×k (row stride ldb),
// with gemmDot3x4, or gemmDot4x6 when wide is set: rows of x and W are
// read where they lie. k past the kernel's multiple (8, or 16) is summed
// in Go. It stores or, when acc is set, adds, and then adds bias (n
// values, or nil). Whole tiles of 4 columns, with k a multiple of 8, go
// to gemmDotTiles3x4 (or its 2- and 1-row kernels for the last rows),
// which does all of that in the kernel, a row of tiles a call, and whole
// 4×6 tiles (k a multiple of 16) to gemmDotTile4x6: at m = 24
// it ran 1.10× and at 11 1.02–1.11× the buffered calls (Zen 3, one
// thread, TestGemmAB -gemmab 128,0).
func gemmDotSerial(wide bool, m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool, bias []float32) {
	rows, cols, kv, blockN := 3, 4, k&^7, dotBlockN
	if wide {
		rows, cols, kv, blockN = 4, 6, k&^15, dotBlockN512
	}
	if m > 0 && n > 0 && k > 0 {
		// The kernels read and write where these point, unchecked.
		_, _, _ = a[(m-1)*lda+k-1], b[(n-1)*ldb+k-1], c[(m-1)*ldc+n-1]
	}
	var out [24]float32
	// row returns row i of a block of rows (of cols) clamped into range:
	// a partial block repeats its last row, whose results are dropped.
	xrow := func(i, lim int) *float32 { return &a[min(i, lim-1)*lda] }
	wrow := func(j, lim int) *float32 { return &b[min(j, lim-1)*ldb] }
	// whole tiles go to the kernels that store their own (gemmAB for A/B).
	whole := k > 0 && kv == k && gemmAB&128 == 0
	for jb := 0; jb < n; jb += blockN {
		je := min(jb+blockN, n)
		for i := 0; i < m; i += rows {
			j := jb
			if wide && whole && i+rows <= m {
				// Whole 4×6 tiles: stored, added and biased in the kernel.
				for ; j+cols <= je; j += cols {
					var bp *float32
					if bias != nil {
						bp = &bias[j]
					}
					gemmDotTile4x6(k, &a[i*lda], lda, &b[j*ldb], ldb, &c[i*ldc+j], ldc, bp, acc)
				}
			}
			if !wide && whole {
				// Whole 4-column tiles of 1 to 3 rows: stored, added and
				// biased in the kernel.
				if t := (je - jb) / cols; t > 0 {
					var bp *float32
					if bias != nil {
						bp = &bias[jb]
					}
					x, w, cc := &a[i*lda], &b[jb*ldb], &c[i*ldc+jb]
					switch {
					case i+3 <= m:
						gemmDotTiles3x4(k, x, lda, w, ldb, cc, ldc, bp, acc, t)
					case i+2 == m && gemmAB&256 == 0:
						gemmDotTiles2x4(k, x, lda, w, ldb, cc, ldc, bp, acc, t)
					case gemmAB&256 == 0:
						gemmDotTiles1x4(k, x, lda, w, ldb, cc, ldc, bp, acc, t)
					default:
						t = 0
					}
					j += t * cols
				}
			}
			for ; j < je; j += cols {
				switch {
				case kv == 0:
					out = [24]float32{}
				case wide:
					gemmDot4x6(kv, xrow(i, m), xrow(i+1, m), xrow(i+2, m), xrow(i+3, m),
						wrow(j, je), wrow(j+1, je), wrow(j+2, je), wrow(j+3, je), wrow(j+4, je), wrow(j+5, je), &out)
				default:
					gemmDot3x4(kv, xrow(i, m), xrow(i+1, m), xrow(i+2, m),
						wrow(j, je), wrow(j+1, je), wrow(j+2, je), wrow(j+3, je), (*[12]float32)(out[:12]))
				}
				for r := range min(rows, m-i) {
					xr := a[(i+r)*lda:][:k]
					cr := c[(i+r)*ldc:][:n]
					for q := range min(cols, je-j) {
						v := out[cols*r+q]
						if kv < k {
							wr := b[(j+q)*ldb:][:k]
							for p := kv; p < k; p++ {
								v += xr[p] * wr[p]
							}
						}
						if acc {
							v += cr[j+q]
						}
						if bias != nil {
							v += bias[j+q]
						}
						cr[j+q] = v
					}
				}
			}
		}
	}
}
