package gpuhost

// dotMaxM is the most rows of x for which x·Wᵀ runs as dot products
// (gemmDotSerial) rather than through packing: packing transposes all of
// W, which costs more than a few rows of arithmetic. A batch of one-row
// requests is such a product. Measured on a Zen 3 core at n=4096, k=1024
// in GFLOP per CPU-second, dot against packed: 3.2/1.0 at 1 row, 22/12 at
// 12, 34/22 at 24, 42/35 at 48.
const dotMaxM = 48

// dotBlockN is how many rows of W one pass keeps hot while every row of x
// is dotted with them.
const dotBlockN = 16

// gemmDotSerial computes the m×n block of c (row stride ldc) as
// op(a)·bᵀ, op(a) = a (m×k, row stride lda) and b n×k (row stride ldb),
// with gemmDot3x4: rows of x and W are read where they lie. It stores or,
// when acc is set, adds, and then adds bias (n values, or nil).
func gemmDotSerial(m, n, k int, a []float32, lda int, b []float32, ldb int, c []float32, ldc int, acc bool, bias []float32) {
	k8 := k &^ 7
	var out [12]float32
	// row returns row i of a block of 3 (of 4) clamped into range: a
	// partial block repeats its last row, whose results are dropped.
	xrow := func(i, lim int) *float32 { return &a[min(i, lim-1)*lda] }
	wrow := func(j, lim int) *float32 { return &b[min(j, lim-1)*ldb] }
	for jb := 0; jb < n; jb += dotBlockN {
		je := min(jb+dotBlockN, n)
		for i := 0; i < m; i += 3 {
			for j := jb; j < je; j += 4 {
				if k8 > 0 {
					gemmDot3x4(k8, xrow(i, m), xrow(i+1, m), xrow(i+2, m),
						wrow(j, je), wrow(j+1, je), wrow(j+2, je), wrow(j+3, je), &out)
				} else {
					out = [12]float32{}
				}
				for r := range min(3, m-i) {
					xr := a[(i+r)*lda:][:k]
					cr := c[(i+r)*ldc:][:n]
					for q := range min(4, je-j) {
						v := out[4*r+q]
						if k8 < k {
							wr := b[(j+q)*ldb:][:k]
							for p := k8; p < k; p++ {
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
