//go:build amd64 && !purego

#include "textflag.h"

// The AVX-512F versions of softmax_amd64.s's kernels: the same float64
// arithmetic on runs of 16 floats, each widened to two runs of 8 doubles,
// for n a multiple of 16. The exponential is softmax_amd64.s's (clamp at
// −708, k = round(t·log2 e), r = t − k·ln 2 in two parts, the degree-9
// Taylor polynomial), with its constants held in Z18–Z31 for the whole
// loop and 2^k applied by VSCALEFPD, which is exact here as the AVX2
// code's exponent bits are: k is in [−1021, 0] and p(r)·2^k stays normal.

DATA exp512K<>+0(SB)/8, $0xc086200000000000 // −708.0
DATA exp512K<>+8(SB)/8, $0x3ff71547652b82fe // log2(e)
DATA exp512K<>+16(SB)/8, $0x3fe62e42fee00000 // ln 2, high part
DATA exp512K<>+24(SB)/8, $0x3dea39ef35793c76 // ln 2, low part
DATA exp512K<>+32(SB)/8, $0x3ec71de3a556c734 // c9 = 1/9!
DATA exp512K<>+40(SB)/8, $0x3efa01a01a01a01a // c8
DATA exp512K<>+48(SB)/8, $0x3f2a01a01a01a01a // c7
DATA exp512K<>+56(SB)/8, $0x3f56c16c16c16c17 // c6
DATA exp512K<>+64(SB)/8, $0x3f81111111111111 // c5
DATA exp512K<>+72(SB)/8, $0x3fa5555555555555 // c4
DATA exp512K<>+80(SB)/8, $0x3fc5555555555555 // c3
DATA exp512K<>+88(SB)/8, $0x3fe0000000000000 // c2
DATA exp512K<>+96(SB)/8, $0x3ff0000000000000 // c1
DATA exp512K<>+104(SB)/8, $0x3ff0000000000000 // c0
GLOBL exp512K<>(SB), RODATA|NOPTR, $112

// EXPSETUP512 broadcasts the constants: Z31 the clamp, Z30 log2 e, Z29
// and Z28 ln 2's parts, Z27–Z18 the coefficients c9 down to c0.
#define EXPSETUP512 \
	VBROADCASTSD exp512K<>+0(SB), Z31 \
	VBROADCASTSD exp512K<>+8(SB), Z30 \
	VBROADCASTSD exp512K<>+16(SB), Z29 \
	VBROADCASTSD exp512K<>+24(SB), Z28 \
	VBROADCASTSD exp512K<>+32(SB), Z27 \
	VBROADCASTSD exp512K<>+40(SB), Z26 \
	VBROADCASTSD exp512K<>+48(SB), Z25 \
	VBROADCASTSD exp512K<>+56(SB), Z24 \
	VBROADCASTSD exp512K<>+64(SB), Z23 \
	VBROADCASTSD exp512K<>+72(SB), Z22 \
	VBROADCASTSD exp512K<>+80(SB), Z21 \
	VBROADCASTSD exp512K<>+88(SB), Z20 \
	VBROADCASTSD exp512K<>+96(SB), Z19 \
	VBROADCASTSD exp512K<>+104(SB), Z18

// EXP512 sets T = e^T for T <= 0 (8 doubles), using K and P as
// temporaries and Z18–Z31 as loaded by EXPSETUP512.
#define EXP512(T, K, P) \
	VMAXPD Z31, T, T \
	VMULPD Z30, T, K \
	VRNDSCALEPD $0, K, K \
	VFNMADD231PD Z29, K, T \
	VFNMADD231PD Z28, K, T \
	VMOVAPD Z27, P \
	VFMADD213PD Z26, T, P \
	VFMADD213PD Z25, T, P \
	VFMADD213PD Z24, T, P \
	VFMADD213PD Z23, T, P \
	VFMADD213PD Z22, T, P \
	VFMADD213PD Z21, T, P \
	VFMADD213PD Z20, T, P \
	VFMADD213PD Z19, T, P \
	VFMADD213PD Z18, T, P \
	VSCALEFPD K, P, T

// HSUM512S folds the 8 doubles of Z0 and Z1 into X0's low lane.
#define HSUM512S \
	VADDPD Z1, Z0, Z0 \
	VEXTRACTF64X4 $1, Z0, Y1 \
	VADDPD Y1, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPD X1, X0, X0 \
	VUNPCKHPD X0, X0, X1 \
	VADDSD X1, X0, X0

// func expSumAVX512(x *float32, n int, m float64) float64
//
// Returns Σ e^(x−m) in float64, for n a multiple of 16.
TEXT ·expSumAVX512(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSD m+16(FP), Z7
	EXPSETUP512
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	SHRQ $4, CX
	JZ es512done
es512loop:
	VCVTPS2PD (SI), Z2
	VCVTPS2PD 32(SI), Z3
	VSUBPD Z7, Z2, Z2
	VSUBPD Z7, Z3, Z3
	EXP512(Z2, Z4, Z5)
	EXP512(Z3, Z9, Z10)
	VADDPD Z2, Z0, Z0
	VADDPD Z3, Z1, Z1
	ADDQ $64, SI
	DECQ CX
	JNZ es512loop
es512done:
	HSUM512S
	VZEROUPPER
	MOVSD X0, ret+24(FP)
	RET

// func expScaleAVX512(y, x *float32, n int, m, inv float64)
//
// y = float32(e^(x−m)·inv), for n a multiple of 16.
TEXT ·expScaleAVX512(SB), NOSPLIT, $0-40
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSD m+24(FP), Z7
	VBROADCASTSD inv+32(FP), Z6
	EXPSETUP512
	SHRQ $4, CX
	JZ esc512done
esc512loop:
	VCVTPS2PD (SI), Z2
	VCVTPS2PD 32(SI), Z3
	VSUBPD Z7, Z2, Z2
	VSUBPD Z7, Z3, Z3
	EXP512(Z2, Z4, Z5)
	EXP512(Z3, Z9, Z10)
	VMULPD Z6, Z2, Z2
	VMULPD Z6, Z3, Z3
	VCVTPD2PS Z2, Y2
	VCVTPD2PS Z3, Y3
	VINSERTF64X4 $1, Y3, Z2, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ esc512loop
esc512done:
	VZEROUPPER
	RET

// func dotF64AVX512(x, y *float32, n int) float64
//
// Returns Σ x·y in float64, for n a multiple of 16.
TEXT ·dotF64AVX512(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DX
	MOVQ n+16(FP), CX
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	SHRQ $4, CX
	JZ dot512done
dot512loop:
	VCVTPS2PD (SI), Z2
	VCVTPS2PD 32(SI), Z3
	VCVTPS2PD (DX), Z4
	VCVTPS2PD 32(DX), Z5
	VFMADD231PD Z4, Z2, Z0
	VFMADD231PD Z5, Z3, Z1
	ADDQ $64, SI
	ADDQ $64, DX
	DECQ CX
	JNZ dot512loop
dot512done:
	HSUM512S
	VZEROUPPER
	MOVSD X0, ret+24(FP)
	RET

// func softmaxGradAVX512(gx, y, gy *float32, n int, s float64)
//
// gx = float32(y·(gy − s)) in float64, for n a multiple of 16.
TEXT ·softmaxGradAVX512(SB), NOSPLIT, $0-40
	MOVQ gx+0(FP), DI
	MOVQ y+8(FP), SI
	MOVQ gy+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSD s+32(FP), Z7
	SHRQ $4, CX
	JZ sg512done
sg512loop:
	VCVTPS2PD (DX), Z2
	VCVTPS2PD 32(DX), Z3
	VSUBPD Z7, Z2, Z2
	VSUBPD Z7, Z3, Z3
	VCVTPS2PD (SI), Z4
	VCVTPS2PD 32(SI), Z5
	VMULPD Z4, Z2, Z2
	VMULPD Z5, Z3, Z3
	VCVTPD2PS Z2, Y2
	VCVTPD2PS Z3, Y3
	VINSERTF64X4 $1, Y3, Z2, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	DECQ CX
	JNZ sg512loop
sg512done:
	VZEROUPPER
	RET

// func addF32AVX512(dst, x, y *float32, n int)
//
// dst = x + y in float32, for n a multiple of 16; dst may be x or y.
TEXT ·addF32AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ addf512done
addf512loop:
	VMOVUPS (SI), Z0
	VADDPS (DX), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	DECQ CX
	JNZ addf512loop
addf512done:
	VZEROUPPER
	RET
