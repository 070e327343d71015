//go:build amd64 && !purego

#include "textflag.h"

// Row kernels of layer_norm. Each takes n, a multiple of 8, and works in
// float64 like the Go code it replaces: a float32 run of 8 is widened to
// two runs of 4 doubles (VCVTPS2PD), so that row statistics keep their
// accuracy.

// hsum folds the 4 doubles of Y0 and Y1 into X0's low lane.
#define HSUM \
	VADDPD Y1, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPD X1, X0, X0 \
	VUNPCKHPD X0, X0, X1 \
	VADDSD X1, X0, X0

// func sumF64AVX2(x *float32, n int) float64
TEXT ·sumF64AVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	SHRQ $3, CX
	JZ sumdone
sumloop:
	VCVTPS2PD (SI), Y2
	VCVTPS2PD 16(SI), Y3
	VADDPD Y2, Y0, Y0
	VADDPD Y3, Y1, Y1
	ADDQ $32, SI
	DECQ CX
	JNZ sumloop
sumdone:
	HSUM
	VZEROUPPER
	MOVSD X0, ret+16(FP)
	RET

// func addSumF64AVX2(s, x, r *float32, n int) float64
//
// s = x + r in float32, and returns Σ s in float64.
TEXT ·addSumF64AVX2(SB), NOSPLIT, $0-40
	MOVQ s+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ r+16(FP), DX
	MOVQ n+24(FP), CX
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	SHRQ $3, CX
	JZ adddone
addloop:
	VMOVUPS (SI), Y4
	VADDPS (DX), Y4, Y4
	VMOVUPS Y4, (DI)
	VCVTPS2PD X4, Y2
	VEXTRACTF128 $1, Y4, X5
	VCVTPS2PD X5, Y3
	VADDPD Y2, Y0, Y0
	VADDPD Y3, Y1, Y1
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ addloop
adddone:
	HSUM
	VZEROUPPER
	MOVSD X0, ret+32(FP)
	RET

// func sqDevF64AVX2(x *float32, n int, m float64) float64
//
// Returns Σ (x − m)² in float64.
TEXT ·sqDevF64AVX2(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSD m+16(FP), Y7
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	SHRQ $3, CX
	JZ sqdone
sqloop:
	VCVTPS2PD (SI), Y2
	VCVTPS2PD 16(SI), Y3
	VSUBPD Y7, Y2, Y2
	VSUBPD Y7, Y3, Y3
	VFMADD231PD Y2, Y2, Y0
	VFMADD231PD Y3, Y3, Y1
	ADDQ $32, SI
	DECQ CX
	JNZ sqloop
sqdone:
	HSUM
	VZEROUPPER
	MOVSD X0, ret+24(FP)
	RET

// func lnApplyAVX2(y, x, w, b *float32, n int, m, inv float64)
//
// y = float32((x − m)·inv)·w + b; y may be x.
TEXT ·lnApplyAVX2(SB), NOSPLIT, $0-56
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), R8
	MOVQ b+24(FP), R9
	MOVQ n+32(FP), CX
	VBROADCASTSD m+40(FP), Y7
	VBROADCASTSD inv+48(FP), Y6
	SHRQ $3, CX
	JZ applydone
applyloop:
	VCVTPS2PD (SI), Y2
	VCVTPS2PD 16(SI), Y3
	VSUBPD Y7, Y2, Y2
	VSUBPD Y7, Y3, Y3
	VMULPD Y6, Y2, Y2
	VMULPD Y6, Y3, Y3
	VCVTPD2PSY Y2, X2
	VCVTPD2PSY Y3, X3
	VINSERTF128 $1, X3, Y2, Y2
	VMULPS (R8), Y2, Y2
	VADDPS (R9), Y2, Y2
	VMOVUPS Y2, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	ADDQ $32, R8
	ADDQ $32, R9
	DECQ CX
	JNZ applyloop
applydone:
	VZEROUPPER
	RET

// func lnBwdSumsAVX2(x, gy, w *float32, n int, m, inv float64) (sg, sgx float64)
//
// With ĝ = g·w and x̂ = (x − m)·inv, in float64: sg = Σ ĝ, sgx = Σ ĝ·x̂.
TEXT ·lnBwdSumsAVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ gy+8(FP), DX
	MOVQ w+16(FP), R8
	MOVQ n+24(FP), CX
	VBROADCASTSD m+32(FP), Y7
	VBROADCASTSD inv+40(FP), Y6
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y8, Y8, Y8
	VXORPD Y9, Y9, Y9
	SHRQ $3, CX
	JZ sumsdone
sumsloop:
	VCVTPS2PD (DX), Y2
	VCVTPS2PD 16(DX), Y3
	VCVTPS2PD (R8), Y4
	VCVTPS2PD 16(R8), Y5
	VMULPD Y4, Y2, Y2 // ĝ
	VMULPD Y5, Y3, Y3
	VADDPD Y2, Y0, Y0
	VADDPD Y3, Y1, Y1
	VCVTPS2PD (SI), Y4
	VCVTPS2PD 16(SI), Y5
	VSUBPD Y7, Y4, Y4
	VSUBPD Y7, Y5, Y5
	VMULPD Y6, Y4, Y4 // x̂
	VMULPD Y6, Y5, Y5
	VFMADD231PD Y4, Y2, Y8
	VFMADD231PD Y5, Y3, Y9
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, R8
	DECQ CX
	JNZ sumsloop
sumsdone:
	HSUM
	MOVSD X0, sg+48(FP)
	VMOVAPD Y8, Y0
	VMOVAPD Y9, Y1
	HSUM
	VZEROUPPER
	MOVSD X0, sgx+56(FP)
	RET

// func lnBwdApplyAVX2(o, x, gy, w *float32, n int, m, inv, sg, sgx float64)
//
// o = float32(inv·(ĝ − sg − x̂·sgx)), with sg and sgx the row means.
TEXT ·lnBwdApplyAVX2(SB), NOSPLIT, $0-72
	MOVQ o+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ gy+16(FP), DX
	MOVQ w+24(FP), R8
	MOVQ n+32(FP), CX
	VBROADCASTSD m+40(FP), Y7
	VBROADCASTSD inv+48(FP), Y6
	VBROADCASTSD sg+56(FP), Y10
	VBROADCASTSD sgx+64(FP), Y11
	SHRQ $3, CX
	JZ bapplydone
bapplyloop:
	VCVTPS2PD (DX), Y2
	VCVTPS2PD 16(DX), Y3
	VCVTPS2PD (R8), Y4
	VCVTPS2PD 16(R8), Y5
	VMULPD Y4, Y2, Y2 // ĝ
	VMULPD Y5, Y3, Y3
	VSUBPD Y10, Y2, Y2 // ĝ − sg
	VSUBPD Y10, Y3, Y3
	VCVTPS2PD (SI), Y4
	VCVTPS2PD 16(SI), Y5
	VSUBPD Y7, Y4, Y4
	VSUBPD Y7, Y5, Y5
	VMULPD Y6, Y4, Y4 // x̂
	VMULPD Y6, Y5, Y5
	VFNMADD231PD Y11, Y4, Y2 // − x̂·sgx
	VFNMADD231PD Y11, Y5, Y3
	VMULPD Y6, Y2, Y2
	VMULPD Y6, Y3, Y3
	VCVTPD2PSY Y2, X2
	VCVTPD2PSY Y3, X3
	VINSERTF128 $1, X3, Y2, Y2
	VMOVUPS Y2, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, R8
	ADDQ $32, DI
	DECQ CX
	JNZ bapplyloop
bapplydone:
	VZEROUPPER
	RET

// func lnBwdColsAVX2(sw, sb *float64, x, gy *float32, n int, m, inv float64)
//
// sw[i] += g[i]·(x[i] − m)·inv and sb[i] += g[i], in float64: one row's
// share of the weight and bias gradients.
TEXT ·lnBwdColsAVX2(SB), NOSPLIT, $0-56
	MOVQ sw+0(FP), DI
	MOVQ sb+8(FP), BX
	MOVQ x+16(FP), SI
	MOVQ gy+24(FP), DX
	MOVQ n+32(FP), CX
	VBROADCASTSD m+40(FP), Y7
	VBROADCASTSD inv+48(FP), Y6
	SHRQ $3, CX
	JZ colsdone
colsloop:
	VCVTPS2PD (SI), Y2
	VCVTPS2PD 16(SI), Y3
	VCVTPS2PD (DX), Y4
	VCVTPS2PD 16(DX), Y5
	VSUBPD Y7, Y2, Y2
	VSUBPD Y7, Y3, Y3
	VMULPD Y6, Y2, Y2 // x̂
	VMULPD Y6, Y3, Y3
	VMOVUPD (DI), Y8
	VMOVUPD 32(DI), Y9
	VFMADD231PD Y4, Y2, Y8
	VFMADD231PD Y5, Y3, Y9
	VMOVUPD Y8, (DI)
	VMOVUPD Y9, 32(DI)
	VADDPD (BX), Y4, Y4
	VADDPD 32(BX), Y5, Y5
	VMOVUPD Y4, (BX)
	VMOVUPD Y5, 32(BX)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $64, DI
	ADDQ $64, BX
	DECQ CX
	JNZ colsloop
colsdone:
	VZEROUPPER
	RET
