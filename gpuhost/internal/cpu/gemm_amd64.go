//go:build amd64 && !purego

package cpu

import "golang.org/x/sys/cpu"

// gemmHaveAsm reports whether this CPU runs the AVX2/FMA kernel, and
// gemmHaveAVX512 the AVX-512F one; x/sys/cpu also checks that the OS
// saves the YMM and ZMM registers.
var (
	gemmHaveAsm    = cpu.X86.HasAVX2 && cpu.X86.HasFMA
	gemmHaveAVX512 = gemmHaveAsm && cpu.X86.HasAVX512F
)

// gemmKernel6x16 computes the 6×16 product of a packed A panel (6 values
// per k) and a packed B panel (16 values per k) over kc steps, and stores
// it into c (row stride ldc floats), or adds it to c when add is set; then
// it adds bias[0:16] to each row unless bias is nil. bs is unused (the
// 16-wide kernel reads one B panel). Implemented in gemm_amd64.s.
//
//go:noescape
func gemmKernel6x16(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, panels int)

// gemmEdge6x16 is gemmKernel6x16 for the top rows rows (1 to 5) of one
// 6-high A panel: the last rows of m (4 at m = 64, 256 and 1024) go
// straight into c. Implemented in gemm_amd64.s.
//
//go:noescape
func gemmEdge6x16(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, rows int)

// gemmKernel14x32 is gemmKernel6x16 for a 14×32 tile with AVX-512F: the
// 32 columns of B come from two 16-wide panels, at b and bs floats on.
// Implemented in gemm_amd64.s.
//
//go:noescape
func gemmKernel14x32(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, panels int)

// gemmEdge14x32 is gemmKernel14x32 for the top rows rows (1 to 13) of one
// 14-high A panel. Implemented in gemm_amd64.s.
//
//go:noescape
func gemmEdge14x32(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, rows int)

// packBTrans16 packs 16 rows of src (row stride ldb floats) into a
// k-major panel: dst[(8g+k)·16 + r] = src[r·ldb + 8g+k] for g < groups,
// k < 8 and r < 16. Implemented in gemm_amd64.s.
//
//go:noescape
func packBTrans16(groups int, src *float32, ldb int, dst *float32)

// packBRows16 packs panels whole 16-wide panels of a row-major B (row
// stride ldb floats), kc rows deep, into panels bs floats apart:
// dst[q·bs + 16k + j] = src[k·ldb + 16q + j]. Implemented in gemm_amd64.s.
//
//go:noescape
func packBRows16(kc int, src *float32, ldb int, dst *float32, panels, bs int)

// gemmDot3x4 sets out[4i+j] to the dot product of xi and wj over k values,
// k a multiple of 8. Implemented in gemm_amd64.s.
//
//go:noescape
func gemmDot3x4(k int, x0, x1, x2, w0, w1, w2, w3 *float32, out *[12]float32)

// gemmDotTiles3x4 computes tiles 3×4 tiles of c side by side from 3 rows
// of x and 4·tiles rows of W, k a multiple of 8: each stored, or added to
// c when add is set, then given its bias when bias is not nil.
// Implemented in gemm_amd64.s.
//
//go:noescape
func gemmDotTiles3x4(k int, x *float32, lda int, w *float32, ldb int, c *float32, ldc int, bias *float32, add bool, tiles int)

// gemmDotTiles2x4 is gemmDotTiles3x4 for 2 rows of x. Implemented in
// gemm_amd64.s.
//
//go:noescape
func gemmDotTiles2x4(k int, x *float32, lda int, w *float32, ldb int, c *float32, ldc int, bias *float32, add bool, tiles int)

// gemmDotTiles1x4 is gemmDotTiles3x4 for 1 row of x. Implemented in
// gemm_amd64.s.
//
//go:noescape
func gemmDotTiles1x4(k int, x *float32, lda int, w *float32, ldb int, c *float32, ldc int, bias *float32, add bool, tiles int)

// gemmDot4x6 sets out[6i+j] to the dot product of xi and wj over k values,
// k a multiple of 16, with AVX-512F: gemmDot3x4 at twice the width.
// Implemented in gemm_amd64.s.
//
//go:noescape
func gemmDot4x6(k int, x0, x1, x2, x3, w0, w1, w2, w3, w4, w5 *float32, out *[24]float32)

// gemmDotTile4x6 computes one whole 4×6 tile of c from 4 rows of x and
// 6 of W, k a multiple of 16, with AVX-512F: stored, or added to c when
// add is set, then given its bias when bias is not nil. Implemented in
// gemm_amd64.s.
//
//go:noescape
func gemmDotTile4x6(k int, x *float32, lda int, w *float32, ldb int, c *float32, ldc int, bias *float32, add bool)

// prefetchRows16 prefetches lines cache lines of each of rows rows of src
// (stride ldb floats) into L2. Implemented in gemm_amd64.s.
//
//go:noescape
func prefetchRows16(rows int, src *float32, ldb, lines int)

// packA6x8 packs 6 rows of a row-major A (row stride lda floats) into a
// 6-high panel, 8 k at a time: dst[48g + 6k + r] = src[r·lda + 8g+k] for
// g < groups, k < 8, r < 6. It also writes dst[48·groups] and the value
// after, for the caller to overwrite. Implemented in gemm_amd64.s.
//
//go:noescape
func packA6x8(groups int, src *float32, lda int, dst *float32)

// packA14x8 is packA6x8 for 14 rows (the AVX-512 kernel's panels):
// dst[112g + 14k + r] = src[r·lda + 8g+k], and it also writes
// dst[112·groups] and the value after. Implemented in gemm_amd64.s.
//
//go:noescape
func packA14x8(groups int, src *float32, lda int, dst *float32)
