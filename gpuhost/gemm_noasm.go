//go:build !amd64 || purego

package gpuhost

// gemmHaveAsm is false: this build has only the portable kernel.
const gemmHaveAsm = false

// gemmKernel6x16 exists so that gemm_asm.go compiles; it is never called
// because gemmHaveAsm is false.
func gemmKernel6x16(kc int, a, b, c *float32, ldc int, add bool) {
	panic("BUG: gpuhost: assembly GEMM kernel called in a build without it")
}
