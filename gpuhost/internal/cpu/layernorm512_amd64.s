//go:build amd64 && !purego

#include "textflag.h"

// The AVX-512F versions of layernorm_amd64.s's row kernels: the same
// float64 arithmetic on runs of 16 floats, each widened to two runs of 8
// doubles (VCVTPS2PD Y→Z). Each takes n, a multiple of 16. Only AVX-512F
// instructions: VXORPD and VEXTRACTF32X8 on Z registers are AVX-512DQ.

// HSUM512 folds the 8 doubles of Z0 and Z1 into X0's low lane.
#define HSUM512 \
	VADDPD Z1, Z0, Z0 \
	VEXTRACTF64X4 $1, Z0, Y1 \
	VADDPD Y1, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPD X1, X0, X0 \
	VUNPCKHPD X0, X0, X1 \
	VADDSD X1, X0, X0

// func sumF64AVX512(x *float32, n int) float64
TEXT ·sumF64AVX512(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	SHRQ $4, CX
	JZ sum512done
sum512loop:
	VCVTPS2PD (SI), Z2
	VCVTPS2PD 32(SI), Z3
	VADDPD Z2, Z0, Z0
	VADDPD Z3, Z1, Z1
	ADDQ $64, SI
	DECQ CX
	JNZ sum512loop
sum512done:
	HSUM512
	VZEROUPPER
	MOVSD X0, ret+16(FP)
	RET

// func addSumF64AVX512(s, x, r *float32, n int) float64
//
// s = x + r in float32, and returns Σ s in float64.
TEXT ·addSumF64AVX512(SB), NOSPLIT, $0-40
	MOVQ s+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ r+16(FP), DX
	MOVQ n+24(FP), CX
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	SHRQ $4, CX
	JZ add512done
add512loop:
	VMOVUPS (SI), Z4
	VADDPS (DX), Z4, Z4
	VMOVUPS Z4, (DI)
	VCVTPS2PD Y4, Z2
	VEXTRACTF64X4 $1, Z4, Y5
	VCVTPS2PD Y5, Z3
	VADDPD Z2, Z0, Z0
	VADDPD Z3, Z1, Z1
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	DECQ CX
	JNZ add512loop
add512done:
	HSUM512
	VZEROUPPER
	MOVSD X0, ret+32(FP)
	RET

// func sqDevF64AVX512(x *float32, n int, m float64) float64
//
// Returns Σ (x − m)² in float64.
TEXT ·sqDevF64AVX512(SB), NOSPLIT, $0-32
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSD m+16(FP), Z7
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	SHRQ $4, CX
	JZ sq512done
sq512loop:
	VCVTPS2PD (SI), Z2
	VCVTPS2PD 32(SI), Z3
	VSUBPD Z7, Z2, Z2
	VSUBPD Z7, Z3, Z3
	VFMADD231PD Z2, Z2, Z0
	VFMADD231PD Z3, Z3, Z1
	ADDQ $64, SI
	DECQ CX
	JNZ sq512loop
sq512done:
	HSUM512
	VZEROUPPER
	MOVSD X0, ret+24(FP)
	RET

// func lnApplyAVX512(y, x, w, b *float32, n int, m, inv float64)
//
// y = float32((x − m)·inv)·w + b; y may be x.
TEXT ·lnApplyAVX512(SB), NOSPLIT, $0-56
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), R8
	MOVQ b+24(FP), R9
	MOVQ n+32(FP), CX
	VBROADCASTSD m+40(FP), Z7
	VBROADCASTSD inv+48(FP), Z6
	SHRQ $4, CX
	JZ apply512done
apply512loop:
	VCVTPS2PD (SI), Z2
	VCVTPS2PD 32(SI), Z3
	VSUBPD Z7, Z2, Z2
	VSUBPD Z7, Z3, Z3
	VMULPD Z6, Z2, Z2
	VMULPD Z6, Z3, Z3
	VCVTPD2PS Z2, Y2
	VCVTPD2PS Z3, Y3
	VINSERTF64X4 $1, Y3, Z2, Z2
	VMULPS (R8), Z2, Z2
	VADDPS (R9), Z2, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R8
	ADDQ $64, R9
	DECQ CX
	JNZ apply512loop
apply512done:
	VZEROUPPER
	RET

// func lnBwdSumsAVX512(x, gy, w *float32, n int, m, inv float64) (sg, sgx float64)
//
// With ĝ = g·w and x̂ = (x − m)·inv, in float64: sg = Σ ĝ, sgx = Σ ĝ·x̂.
TEXT ·lnBwdSumsAVX512(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), SI
	MOVQ gy+8(FP), DX
	MOVQ w+16(FP), R8
	MOVQ n+24(FP), CX
	VBROADCASTSD m+32(FP), Z7
	VBROADCASTSD inv+40(FP), Z6
	VPXORQ Z0, Z0, Z0
	VPXORQ Z1, Z1, Z1
	VPXORQ Z8, Z8, Z8
	VPXORQ Z9, Z9, Z9
	SHRQ $4, CX
	JZ sums512done
sums512loop:
	VCVTPS2PD (DX), Z2
	VCVTPS2PD 32(DX), Z3
	VCVTPS2PD (R8), Z4
	VCVTPS2PD 32(R8), Z5
	VMULPD Z4, Z2, Z2 // ĝ
	VMULPD Z5, Z3, Z3
	VADDPD Z2, Z0, Z0
	VADDPD Z3, Z1, Z1
	VCVTPS2PD (SI), Z4
	VCVTPS2PD 32(SI), Z5
	VSUBPD Z7, Z4, Z4
	VSUBPD Z7, Z5, Z5
	VMULPD Z6, Z4, Z4 // x̂
	VMULPD Z6, Z5, Z5
	VFMADD231PD Z4, Z2, Z8
	VFMADD231PD Z5, Z3, Z9
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, R8
	DECQ CX
	JNZ sums512loop
sums512done:
	HSUM512
	MOVSD X0, sg+48(FP)
	VMOVAPD Z8, Z0
	VMOVAPD Z9, Z1
	HSUM512
	VZEROUPPER
	MOVSD X0, sgx+56(FP)
	RET

// func lnBwdApplyAVX512(o, x, gy, w *float32, n int, m, inv, sg, sgx float64)
//
// o = float32(inv·(ĝ − sg − x̂·sgx)), with sg and sgx the row means.
TEXT ·lnBwdApplyAVX512(SB), NOSPLIT, $0-72
	MOVQ o+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ gy+16(FP), DX
	MOVQ w+24(FP), R8
	MOVQ n+32(FP), CX
	VBROADCASTSD m+40(FP), Z7
	VBROADCASTSD inv+48(FP), Z6
	VBROADCASTSD sg+56(FP), Z10
	VBROADCASTSD sgx+64(FP), Z11
	SHRQ $4, CX
	JZ bapply512done
bapply512loop:
	VCVTPS2PD (DX), Z2
	VCVTPS2PD 32(DX), Z3
	VCVTPS2PD (R8), Z4
	VCVTPS2PD 32(R8), Z5
	VMULPD Z4, Z2, Z2 // ĝ
	VMULPD Z5, Z3, Z3
	VSUBPD Z10, Z2, Z2 // ĝ − sg
	VSUBPD Z10, Z3, Z3
	VCVTPS2PD (SI), Z4
	VCVTPS2PD 32(SI), Z5
	VSUBPD Z7, Z4, Z4
	VSUBPD Z7, Z5, Z5
	VMULPD Z6, Z4, Z4 // x̂
	VMULPD Z6, Z5, Z5
	VFNMADD231PD Z11, Z4, Z2 // − x̂·sgx
	VFNMADD231PD Z11, Z5, Z3
	VMULPD Z6, Z2, Z2
	VMULPD Z6, Z3, Z3
	VCVTPD2PS Z2, Y2
	VCVTPD2PS Z3, Y3
	VINSERTF64X4 $1, Y3, Z2, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, R8
	ADDQ $64, DI
	DECQ CX
	JNZ bapply512loop
bapply512done:
	VZEROUPPER
	RET

// func lnBwdColsAVX512(sw, sb *float64, x, gy *float32, n int, m, inv float64)
//
// sw[i] += g[i]·(x[i] − m)·inv and sb[i] += g[i], in float64: one row's
// share of the weight and bias gradients.
TEXT ·lnBwdColsAVX512(SB), NOSPLIT, $0-56
	MOVQ sw+0(FP), DI
	MOVQ sb+8(FP), BX
	MOVQ x+16(FP), SI
	MOVQ gy+24(FP), DX
	MOVQ n+32(FP), CX
	VBROADCASTSD m+40(FP), Z7
	VBROADCASTSD inv+48(FP), Z6
	SHRQ $4, CX
	JZ cols512done
cols512loop:
	VCVTPS2PD (SI), Z2
	VCVTPS2PD 32(SI), Z3
	VCVTPS2PD (DX), Z4
	VCVTPS2PD 32(DX), Z5
	VSUBPD Z7, Z2, Z2
	VSUBPD Z7, Z3, Z3
	VMULPD Z6, Z2, Z2 // x̂
	VMULPD Z6, Z3, Z3
	VMOVUPD (DI), Z8
	VMOVUPD 64(DI), Z9
	VFMADD231PD Z4, Z2, Z8
	VFMADD231PD Z5, Z3, Z9
	VMOVUPD Z8, (DI)
	VMOVUPD Z9, 64(DI)
	VADDPD (BX), Z4, Z4
	VADDPD 64(BX), Z5, Z5
	VMOVUPD Z4, (BX)
	VMOVUPD Z5, 64(BX)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $128, DI
	ADDQ $128, BX
	DECQ CX
	JNZ cols512loop
cols512done:
	VZEROUPPER
	RET
