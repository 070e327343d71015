//go:build amd64 && !purego

#include "textflag.h"

// softmax's exponentials in float64, 4 lanes at a time: e^t for t = x − max
// <= 0 as 2^k·p(r), with k = round(t·log2 e), r = t − k·ln 2 (ln 2 in two
// parts, so that r is exact) in [−ln2/2, ln2/2], and p the Taylor
// polynomial of degree 9, whose error there is below 1e-12 — far below
// the float32 the results are stored in. t is clamped at −708, where e^t
// is a float32 0 anyway; a row whose max is not finite stays in Go.

DATA expK<>+0(SB)/8, $0xc086200000000000 // smallest exponent argument: e^-708 is about 3e-308 = -708.0
DATA expK<>+8(SB)/8, $0xc086200000000000
DATA expK<>+16(SB)/8, $0xc086200000000000
DATA expK<>+24(SB)/8, $0xc086200000000000
DATA expK<>+32(SB)/8, $0x3ff71547652b82fe // log2(e) = 1.4426950408889634
DATA expK<>+40(SB)/8, $0x3ff71547652b82fe
DATA expK<>+48(SB)/8, $0x3ff71547652b82fe
DATA expK<>+56(SB)/8, $0x3ff71547652b82fe
DATA expK<>+64(SB)/8, $0x3fe62e42fee00000 // ln 2, high part (exact in 32 bits) = 0.6931471803691238
DATA expK<>+72(SB)/8, $0x3fe62e42fee00000
DATA expK<>+80(SB)/8, $0x3fe62e42fee00000
DATA expK<>+88(SB)/8, $0x3fe62e42fee00000
DATA expK<>+96(SB)/8, $0x3dea39ef35793c76 // ln 2, low part = 1.9082149292705877e-10
DATA expK<>+104(SB)/8, $0x3dea39ef35793c76
DATA expK<>+112(SB)/8, $0x3dea39ef35793c76
DATA expK<>+120(SB)/8, $0x3dea39ef35793c76
DATA expK<>+128(SB)/8, $0x3ec71de3a556c734 // c9 = 1/9!
DATA expK<>+136(SB)/8, $0x3ec71de3a556c734
DATA expK<>+144(SB)/8, $0x3ec71de3a556c734
DATA expK<>+152(SB)/8, $0x3ec71de3a556c734
DATA expK<>+160(SB)/8, $0x3efa01a01a01a01a // c8 = 1/8!
DATA expK<>+168(SB)/8, $0x3efa01a01a01a01a
DATA expK<>+176(SB)/8, $0x3efa01a01a01a01a
DATA expK<>+184(SB)/8, $0x3efa01a01a01a01a
DATA expK<>+192(SB)/8, $0x3f2a01a01a01a01a // c7 = 1/7!
DATA expK<>+200(SB)/8, $0x3f2a01a01a01a01a
DATA expK<>+208(SB)/8, $0x3f2a01a01a01a01a
DATA expK<>+216(SB)/8, $0x3f2a01a01a01a01a
DATA expK<>+224(SB)/8, $0x3f56c16c16c16c17 // c6 = 1/6!
DATA expK<>+232(SB)/8, $0x3f56c16c16c16c17
DATA expK<>+240(SB)/8, $0x3f56c16c16c16c17
DATA expK<>+248(SB)/8, $0x3f56c16c16c16c17
DATA expK<>+256(SB)/8, $0x3f81111111111111 // c5 = 1/5!
DATA expK<>+264(SB)/8, $0x3f81111111111111
DATA expK<>+272(SB)/8, $0x3f81111111111111
DATA expK<>+280(SB)/8, $0x3f81111111111111
DATA expK<>+288(SB)/8, $0x3fa5555555555555 // c4 = 1/4!
DATA expK<>+296(SB)/8, $0x3fa5555555555555
DATA expK<>+304(SB)/8, $0x3fa5555555555555
DATA expK<>+312(SB)/8, $0x3fa5555555555555
DATA expK<>+320(SB)/8, $0x3fc5555555555555 // c3 = 1/3!
DATA expK<>+328(SB)/8, $0x3fc5555555555555
DATA expK<>+336(SB)/8, $0x3fc5555555555555
DATA expK<>+344(SB)/8, $0x3fc5555555555555
DATA expK<>+352(SB)/8, $0x3fe0000000000000 // c2 = 1/2!
DATA expK<>+360(SB)/8, $0x3fe0000000000000
DATA expK<>+368(SB)/8, $0x3fe0000000000000
DATA expK<>+376(SB)/8, $0x3fe0000000000000
DATA expK<>+384(SB)/8, $0x3ff0000000000000 // c1 = 1/1!
DATA expK<>+392(SB)/8, $0x3ff0000000000000
DATA expK<>+400(SB)/8, $0x3ff0000000000000
DATA expK<>+408(SB)/8, $0x3ff0000000000000
DATA expK<>+416(SB)/8, $0x3ff0000000000000 // c0 = 1/0!
DATA expK<>+424(SB)/8, $0x3ff0000000000000
DATA expK<>+432(SB)/8, $0x3ff0000000000000
DATA expK<>+440(SB)/8, $0x3ff0000000000000
DATA expK<>+448(SB)/8, $0x00000000000003ff // the float64 exponent bias, as int64
DATA expK<>+456(SB)/8, $0x00000000000003ff
DATA expK<>+464(SB)/8, $0x00000000000003ff
DATA expK<>+472(SB)/8, $0x00000000000003ff
GLOBL expK<>(SB), RODATA|NOPTR, $480

// EXP sets T = e^T for T <= 0 (4 doubles), using K, P and Y8 as
// temporaries and Y12–Y15 as loaded by EXPSETUP.
#define EXP(T, K, P) \
	VMAXPD Y15, T, T \
	VMULPD Y14, T, K \
	VROUNDPD $0, K, K \
	VFNMADD231PD Y13, K, T \
	VFNMADD231PD Y12, K, T \
	VMOVUPD expK<>+128(SB), P \
	VFMADD213PD expK<>+160(SB), T, P \
	VFMADD213PD expK<>+192(SB), T, P \
	VFMADD213PD expK<>+224(SB), T, P \
	VFMADD213PD expK<>+256(SB), T, P \
	VFMADD213PD expK<>+288(SB), T, P \
	VFMADD213PD expK<>+320(SB), T, P \
	VFMADD213PD expK<>+352(SB), T, P \
	VFMADD213PD expK<>+384(SB), T, P \
	VFMADD213PD expK<>+416(SB), T, P \
	VCVTPD2DQY K, X8 \
	VPMOVSXDQ X8, Y8 \
	VPADDQ expK<>+448(SB), Y8, Y8 \
	VPSLLQ $52, Y8, Y8 \
	VMULPD Y8, P, T

#define EXPSETUP \
	VMOVUPD expK<>+0(SB), Y15 \
	VMOVUPD expK<>+32(SB), Y14 \
	VMOVUPD expK<>+64(SB), Y13 \
	VMOVUPD expK<>+96(SB), Y12

// func expSumAVX2(x *float32, n int, m float64) float64
//
// Returns Σ e^(x−m) in float64, for n a multiple of 8.
TEXT ·expSumAVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSD m+16(FP), Y7
	EXPSETUP
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	SHRQ $3, CX
	JZ esdone
esloop:
	VCVTPS2PD (SI), Y2
	VCVTPS2PD 16(SI), Y3
	VSUBPD Y7, Y2, Y2
	VSUBPD Y7, Y3, Y3
	EXP(Y2, Y4, Y5)
	EXP(Y3, Y9, Y10)
	VADDPD Y2, Y0, Y0
	VADDPD Y3, Y1, Y1
	ADDQ $32, SI
	DECQ CX
	JNZ esloop
esdone:
	VADDPD Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPD X1, X0, X0
	VUNPCKHPD X0, X0, X1
	VADDSD X1, X0, X0
	VZEROUPPER
	MOVSD X0, ret+24(FP)
	RET

// func expScaleAVX2(y, x *float32, n int, m, inv float64)
//
// y = float32(e^(x−m)·inv), for n a multiple of 8.
TEXT ·expScaleAVX2(SB), NOSPLIT, $0-40
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSD m+24(FP), Y7
	VBROADCASTSD inv+32(FP), Y6
	EXPSETUP
	SHRQ $3, CX
	JZ escdone
escloop:
	VCVTPS2PD (SI), Y2
	VCVTPS2PD 16(SI), Y3
	VSUBPD Y7, Y2, Y2
	VSUBPD Y7, Y3, Y3
	EXP(Y2, Y4, Y5)
	EXP(Y3, Y9, Y10)
	VMULPD Y6, Y2, Y2
	VMULPD Y6, Y3, Y3
	VCVTPD2PSY Y2, X2
	VCVTPD2PSY Y3, X3
	VINSERTF128 $1, X3, Y2, Y2
	VMOVUPS Y2, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ escloop
escdone:
	VZEROUPPER
	RET

// func dotF64AVX2(x, y *float32, n int) float64
//
// Returns Σ x·y in float64, for n a multiple of 8.
TEXT ·dotF64AVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DX
	MOVQ n+16(FP), CX
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	SHRQ $3, CX
	JZ dotdone
dotloop:
	VCVTPS2PD (SI), Y2
	VCVTPS2PD 16(SI), Y3
	VCVTPS2PD (DX), Y4
	VCVTPS2PD 16(DX), Y5
	VFMADD231PD Y4, Y2, Y0
	VFMADD231PD Y5, Y3, Y1
	ADDQ $32, SI
	ADDQ $32, DX
	DECQ CX
	JNZ dotloop
dotdone:
	VADDPD Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPD X1, X0, X0
	VUNPCKHPD X0, X0, X1
	VADDSD X1, X0, X0
	VZEROUPPER
	MOVSD X0, ret+24(FP)
	RET

// func softmaxGradAVX2(gx, y, gy *float32, n int, s float64)
//
// gx = float32(y·(gy − s)) in float64, for n a multiple of 8: softmax's
// backward, s = Σ gy·y.
TEXT ·softmaxGradAVX2(SB), NOSPLIT, $0-40
	MOVQ gx+0(FP), DI
	MOVQ y+8(FP), SI
	MOVQ gy+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSD s+32(FP), Y7
	SHRQ $3, CX
	JZ sgdone
sgloop:
	VCVTPS2PD (DX), Y2
	VCVTPS2PD 16(DX), Y3
	VSUBPD Y7, Y2, Y2
	VSUBPD Y7, Y3, Y3
	VCVTPS2PD (SI), Y4
	VCVTPS2PD 16(SI), Y5
	VMULPD Y4, Y2, Y2
	VMULPD Y5, Y3, Y3
	VCVTPD2PSY Y2, X2
	VCVTPD2PSY Y3, X3
	VINSERTF128 $1, X3, Y2, Y2
	VMOVUPS Y2, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ sgloop
sgdone:
	VZEROUPPER
	RET

// func addF32AVX2(dst, x, y *float32, n int)
//
// dst = x + y in float32, for n a multiple of 8; dst may be x or y.
TEXT ·addF32AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JZ adddone2
addloop2:
	VMOVUPS (SI), Y0
	VADDPS (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ addloop2
adddone2:
	VZEROUPPER
	RET
