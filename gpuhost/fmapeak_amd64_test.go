//go:build amd64 && !purego

package gpuhost

// fmaPeak8x12 runs n groups of 12 independent 8-lane FMAs on registers.
// Implemented in gemm_amd64.s.
//
//go:noescape
func fmaPeak8x12(n int)

func init() {
	if gemmHaveAsm {
		fmaLoop, fmaLoopFlop = fmaPeak8x12, 2*8*12
	}
}
