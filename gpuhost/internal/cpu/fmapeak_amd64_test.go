//go:build amd64 && !purego

package cpu

// fmaPeak8x12 runs n groups of 12 independent 8-lane FMAs on registers;
// fmaPeak16x12 the same at 16 lanes. Implemented in gemm_amd64.s.
//
//go:noescape
func fmaPeak8x12(n int)

//go:noescape
func fmaPeak16x12(n int)

// The ceiling is that of the widest FMA the path in use runs: on a CPU
// with 512-bit FMA units a YMM loop measures half of what the AVX-512
// kernel can reach.
func init() {
	switch testPath() {
	case PathAVX512:
		fmaLoop, fmaLoopFlop = fmaPeak16x12, 2*16*12
	case PathAVX2:
		fmaLoop, fmaLoopFlop = fmaPeak8x12, 2*8*12
	}
}
