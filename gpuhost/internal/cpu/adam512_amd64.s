//go:build amd64 && !purego

#include "textflag.h"

// func adamAVX512(p, grad, m, v *float32, n int, k *adamLanes, wd bool)
//
// adamAVX2 on 16 lanes, n a multiple of 16: the same operations in the
// same order, so every element is the scalar step's bit for bit. Z8–Z15
// hold k's coefficients, each broadcast from the first of its 8 lanes.
TEXT ·adamAVX512(SB), NOSPLIT, $0-49
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), AX
	MOVBLZX wd+48(FP), DX
	SHRQ $4, CX
	JZ adone
	VBROADCASTSS 0(AX), Z8
	VBROADCASTSS 32(AX), Z9
	VBROADCASTSS 64(AX), Z10
	VBROADCASTSS 96(AX), Z11
	VBROADCASTSS 128(AX), Z12
	VBROADCASTSS 160(AX), Z13
	VBROADCASTSS 192(AX), Z14
	VBROADCASTSS 224(AX), Z15
aloop:
	VMOVUPS (SI), Z0
	VMULPS Z8, Z0, Z0 // g·scale (exact when scale is 1)
	VMOVUPS (DI), Z1
	TESTQ DX, DX
	JZ nowd
	VMULPS Z9, Z1, Z2
	VADDPS Z2, Z0, Z0 // g + wd·p
nowd:
	VMOVUPS (R8), Z3
	VSUBPS Z3, Z0, Z4
	VMULPS Z10, Z4, Z4
	VADDPS Z4, Z3, Z3 // m + (1−β1)(g − m)
	VMOVUPS Z3, (R8)
	VMOVUPS (R9), Z5
	VMULPS Z11, Z5, Z5
	VMULPS Z12, Z0, Z6
	VMULPS Z0, Z6, Z6
	VADDPS Z6, Z5, Z5 // β2·v + ((1−β2)·g)·g
	VMOVUPS Z5, (R9)
	VSQRTPS Z5, Z6
	VDIVPS Z14, Z6, Z6
	VADDPS Z15, Z6, Z6 // √v/√bc2 + eps
	VDIVPS Z6, Z3, Z7
	VMULPS Z13, Z7, Z7
	VSUBPS Z7, Z1, Z1 // p − lr/bc1·(m/den)
	VMOVUPS Z1, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $64, R9
	DECQ CX
	JNZ aloop
adone:
	VZEROUPPER
	RET
