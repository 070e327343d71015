//go:build amd64 && !purego

package gpuhost

import "golang.org/x/sys/cpu"

// gemmHaveAsm reports whether this CPU runs the AVX2/FMA kernel; x/sys/cpu
// also checks that the OS saves the YMM registers.
var gemmHaveAsm = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// gemmKernel6x16 computes the 6×16 product of a packed A panel (6 values
// per k) and a packed B panel (16 values per k) over kc steps, and stores
// it into c (row stride ldc floats), or adds it to c when add is set.
// Implemented in gemm_amd64.s.
//
//go:noescape
func gemmKernel6x16(kc int, a, b, c *float32, ldc int, add bool)
