//go:build !amd64 || purego

package cpu

// gemmHaveAsm and gemmHaveAVX512 are false: this build has only the
// portable kernel.
const (
	gemmHaveAsm    = false
	gemmHaveAVX512 = false
)

// gemmKernel6x16 exists so that gemm_asm.go compiles; it is never called
// because gemmHaveAsm is false.
func gemmKernel6x16(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, panels int) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// gemmEdge6x16 exists so that gemm_asm.go compiles; see gemmKernel6x16.
func gemmEdge6x16(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, rows int) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// gemmKernel14x32 exists so that gemm_asm.go compiles; see gemmKernel6x16.
func gemmKernel14x32(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, panels int) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// gemmEdge14x32 exists so that gemm_asm.go compiles; see gemmKernel6x16.
func gemmEdge14x32(kc int, a, b, c *float32, ldc, bs int, bias *float32, add bool, rows int) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// packBTrans16 exists so that gemm_asm.go compiles; see gemmKernel6x16.
func packBTrans16(groups int, src *float32, ldb int, dst *float32) {
	panic("BUG: gpuhost: assembly GEMM packing called in a build without it")
}

// packBRows16 exists so that gemm_asm.go compiles; see gemmKernel6x16.
func packBRows16(kc int, src *float32, ldb int, dst *float32, panels, bs int) {
	panic("BUG: gpuhost: assembly GEMM packing called in a build without it")
}

// gemmDot3x4 exists so that gemm_dot.go compiles; see gemmKernel6x16.
func gemmDot3x4(k int, x0, x1, x2, w0, w1, w2, w3 *float32, out *[12]float32) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// gemmDotTiles3x4 exists so that gemm_dot.go compiles; see gemmKernel6x16.
func gemmDotTiles3x4(k int, x *float32, lda int, w *float32, ldb int, c *float32, ldc int, bias *float32, add bool, tiles int) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// gemmDotTiles2x4 exists so that gemm_dot.go compiles; see gemmKernel6x16.
func gemmDotTiles2x4(k int, x *float32, lda int, w *float32, ldb int, c *float32, ldc int, bias *float32, add bool, tiles int) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// gemmDotTiles1x4 exists so that gemm_dot.go compiles; see gemmKernel6x16.
func gemmDotTiles1x4(k int, x *float32, lda int, w *float32, ldb int, c *float32, ldc int, bias *float32, add bool, tiles int) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// gemmDotTile4x6 exists so that gemm_dot.go compiles; see gemmKernel6x16.
func gemmDotTile4x6(k int, x *float32, lda int, w *float32, ldb int, c *float32, ldc int, bias *float32, add bool) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// gemmDot4x6 exists so that gemm_dot.go compiles; see gemmKernel6x16.
func gemmDot4x6(k int, x0, x1, x2, x3, w0, w1, w2, w3, w4, w5 *float32, out *[24]float32) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}

// prefetchRows16 exists so that gemm_asm.go compiles; see gemmKernel6x16.
func prefetchRows16(rows int, src *float32, ldb, lines int) {
	panic("BUG: gpuhost: assembly GEMM prefetch called in a build without it")
}

// packA6x8 exists so that gemm_asm.go compiles; see gemmKernel6x16.
func packA6x8(groups int, src *float32, lda int, dst *float32) {
	panic("BUG: gpuhost: assembly GEMM packing called in a build without it")
}

// packA14x8 exists so that gemm_asm.go compiles; see gemmKernel6x16.
func packA14x8(groups int, src *float32, lda int, dst *float32) {
	panic("BUG: gpuhost: assembly GEMM packing called in a build without it")
}
