//go:build amd64 && !purego

#include "textflag.h"

// func adamAVX2(p, grad, m, v *float32, n int, k *adamLanes, wd bool)
//
// One Adam step over n elements, n a multiple of 8, in the order and
// float32 roundings of cpuDevice.adamStep's loop (torch's single-tensor
// Adam, coupled weight decay): no FMA, and VSQRTPS rounds as float32(√)
// of a float64 does. k holds the coefficients, each in 8 lanes: scale,
// wd, 1−β1, β2, 1−β2, lr/bc1, √bc2, eps (Y8–Y15). Y0 holds g then the
// scaled and decayed g, Y1 p, Y3 m, Y5 v.
TEXT ·adamAVX2(SB), NOSPLIT, $0-49
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), AX
	MOVBLZX wd+48(FP), DX
	VMOVUPS 0(AX), Y8
	VMOVUPS 32(AX), Y9
	VMOVUPS 64(AX), Y10
	VMOVUPS 96(AX), Y11
	VMOVUPS 128(AX), Y12
	VMOVUPS 160(AX), Y13
	VMOVUPS 192(AX), Y14
	VMOVUPS 224(AX), Y15
	SHRQ $3, CX
	JZ adone
aloop:
	VMOVUPS (SI), Y0
	VMULPS Y8, Y0, Y0 // g·scale (exact when scale is 1)
	VMOVUPS (DI), Y1
	TESTQ DX, DX
	JZ nowd
	VMULPS Y9, Y1, Y2
	VADDPS Y2, Y0, Y0 // g + wd·p
nowd:
	VMOVUPS (R8), Y3
	VSUBPS Y3, Y0, Y4
	VMULPS Y10, Y4, Y4
	VADDPS Y4, Y3, Y3 // m + (1−β1)(g − m)
	VMOVUPS Y3, (R8)
	VMOVUPS (R9), Y5
	VMULPS Y11, Y5, Y5
	VMULPS Y12, Y0, Y6
	VMULPS Y0, Y6, Y6
	VADDPS Y6, Y5, Y5 // β2·v + ((1−β2)·g)·g
	VMOVUPS Y5, (R9)
	VSQRTPS Y5, Y6
	VDIVPS Y14, Y6, Y6
	VADDPS Y15, Y6, Y6 // √v/√bc2 + eps
	VDIVPS Y6, Y3, Y7
	VMULPS Y13, Y7, Y7
	VSUBPS Y7, Y1, Y1 // p − lr/bc1·(m/den)
	VMOVUPS Y1, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, R9
	DECQ CX
	JNZ aloop
adone:
	VZEROUPPER
	RET
