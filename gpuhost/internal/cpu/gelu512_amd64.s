//go:build amd64 && !purego

#include "textflag.h"

// The AVX-512F versions of gelu_amd64.s's kernels: the same constants,
// broadcast from geluK's first lanes into Z8–Z26 once per call, and the
// same operations in the same order on 16 lanes, so that every lane
// rounds as the AVX2 kernel's does.
//
// Z8 c, Z9 c·a, Z10 3c·a, Z11 ½, Z12 1, Z13 hi, Z14 lo, Z15–Z21 a1–a13,
// Z22–Z25 b0–b6, Z26 −1.
#define GELU_CONSTANTS \
	VBROADCASTSS ·geluK+0(SB), Z8; \
	VBROADCASTSS ·geluK+32(SB), Z9; \
	VBROADCASTSS ·geluK+64(SB), Z10; \
	VBROADCASTSS ·geluK+96(SB), Z11; \
	VBROADCASTSS ·geluK+128(SB), Z12; \
	VBROADCASTSS ·geluK+160(SB), Z13; \
	VBROADCASTSS ·geluK+192(SB), Z14; \
	VBROADCASTSS ·geluK+224(SB), Z15; \
	VBROADCASTSS ·geluK+256(SB), Z16; \
	VBROADCASTSS ·geluK+288(SB), Z17; \
	VBROADCASTSS ·geluK+320(SB), Z18; \
	VBROADCASTSS ·geluK+352(SB), Z19; \
	VBROADCASTSS ·geluK+384(SB), Z20; \
	VBROADCASTSS ·geluK+416(SB), Z21; \
	VBROADCASTSS ·geluK+448(SB), Z22; \
	VBROADCASTSS ·geluK+480(SB), Z23; \
	VBROADCASTSS ·geluK+512(SB), Z24; \
	VBROADCASTSS ·geluK+544(SB), Z25; \
	VBROADCASTSS ·geluK+576(SB), Z26

// GELU_TANH sets Z3 = t = tanh32(u), u = x·(c + c·a·x²) clamped to
// [lo, hi], from Z0 = x; Z1 = x², Z4 = u², Z5 and Z6 the polynomials.
#define GELU_TANH \
	VMULPS Z0, Z0, Z1; \
	VMOVAPS Z9, Z3; \
	VFMADD213PS Z8, Z1, Z3; \
	VMULPS Z0, Z3, Z3; \
	VMINPS Z13, Z3, Z3; \
	VMAXPS Z14, Z3, Z3; \
	VMULPS Z3, Z3, Z4; \
	VMOVAPS Z21, Z5; \
	VMOVAPS Z25, Z6; \
	VFMADD213PS Z20, Z4, Z5; \
	VFMADD213PS Z24, Z4, Z6; \
	VFMADD213PS Z19, Z4, Z5; \
	VFMADD213PS Z23, Z4, Z6; \
	VFMADD213PS Z18, Z4, Z5; \
	VFMADD213PS Z22, Z4, Z6; \
	VFMADD213PS Z17, Z4, Z5; \
	VFMADD213PS Z16, Z4, Z5; \
	VFMADD213PS Z15, Z4, Z5; \
	VMULPS Z3, Z5, Z5; \
	VDIVPS Z6, Z5, Z3; \
	VMINPS Z12, Z3, Z3; \
	VMAXPS Z26, Z3, Z3

// func geluForwardAVX512(y, x *float32, n int)
//
// y[i] = gelu_tanh(x[i]) for i < n, n a multiple of 16: ½x·t + ½x.
TEXT ·geluForwardAVX512(SB), NOSPLIT, $0-24
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ fwddone
	GELU_CONSTANTS
fwdloop:
	VMOVUPS (SI), Z0
	GELU_TANH
	VMULPS Z11, Z0, Z2 // ½x
	VFMADD213PS Z2, Z2, Z3
	VMOVUPS Z3, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ fwdloop
fwddone:
	VZEROUPPER
	RET

// func geluBackwardAVX512(gx, x, gy *float32, n int)
//
// gx[i] = gy[i]·gelu_tanh'(x[i]) for i < n, n a multiple of 16:
// ½(1+t) + ½x(1−t²)·(c + 3c·a·x²). Z7 holds the derivative.
TEXT ·geluBackwardAVX512(SB), NOSPLIT, $0-32
	MOVQ gx+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ gy+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ bwddone
	GELU_CONSTANTS
bwdloop:
	VMOVUPS (SI), Z0
	GELU_TANH
	VMOVAPS Z10, Z7
	VFMADD213PS Z8, Z1, Z7 // c + 3c·a·x²
	VMOVAPS Z3, Z4
	VFNMADD213PS Z12, Z3, Z4 // 1 − t²
	VMULPS Z4, Z7, Z7
	VMULPS Z11, Z0, Z2
	VMULPS Z2, Z7, Z7 // ½x(1−t²)(c + 3c·a·x²)
	VFMADD231PS Z11, Z3, Z7 // + ½t
	VADDPS Z11, Z7, Z7 // + ½
	VMULPS (DX), Z7, Z7
	VMOVUPS Z7, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	DECQ CX
	JNZ bwdloop
bwddone:
	VZEROUPPER
	RET
