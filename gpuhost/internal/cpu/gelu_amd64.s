//go:build amd64 && !purego

#include "textflag.h"

// Constants of gelu_tanh and of tanh32's rational approximation, each
// repeated 8 times for a YMM memory operand (see tanh32). Global, so that
// gelu512_amd64.s broadcasts the same values.
DATA ·geluK+0(SB)/4, $0x3f4c422a // c = 0.7978845608028654
DATA ·geluK+4(SB)/4, $0x3f4c422a
DATA ·geluK+8(SB)/4, $0x3f4c422a
DATA ·geluK+12(SB)/4, $0x3f4c422a
DATA ·geluK+16(SB)/4, $0x3f4c422a
DATA ·geluK+20(SB)/4, $0x3f4c422a
DATA ·geluK+24(SB)/4, $0x3f4c422a
DATA ·geluK+28(SB)/4, $0x3f4c422a
DATA ·geluK+32(SB)/4, $0x3d122279 // ca = 0.035677408136300125
DATA ·geluK+36(SB)/4, $0x3d122279
DATA ·geluK+40(SB)/4, $0x3d122279
DATA ·geluK+44(SB)/4, $0x3d122279
DATA ·geluK+48(SB)/4, $0x3d122279
DATA ·geluK+52(SB)/4, $0x3d122279
DATA ·geluK+56(SB)/4, $0x3d122279
DATA ·geluK+60(SB)/4, $0x3d122279
DATA ·geluK+64(SB)/4, $0x3ddb33b6 // ca3 = 0.10703222440890038
DATA ·geluK+68(SB)/4, $0x3ddb33b6
DATA ·geluK+72(SB)/4, $0x3ddb33b6
DATA ·geluK+76(SB)/4, $0x3ddb33b6
DATA ·geluK+80(SB)/4, $0x3ddb33b6
DATA ·geluK+84(SB)/4, $0x3ddb33b6
DATA ·geluK+88(SB)/4, $0x3ddb33b6
DATA ·geluK+92(SB)/4, $0x3ddb33b6
DATA ·geluK+96(SB)/4, $0x3f000000 // half = 0.5
DATA ·geluK+100(SB)/4, $0x3f000000
DATA ·geluK+104(SB)/4, $0x3f000000
DATA ·geluK+108(SB)/4, $0x3f000000
DATA ·geluK+112(SB)/4, $0x3f000000
DATA ·geluK+116(SB)/4, $0x3f000000
DATA ·geluK+120(SB)/4, $0x3f000000
DATA ·geluK+124(SB)/4, $0x3f000000
DATA ·geluK+128(SB)/4, $0x3f800000 // one = 1.0
DATA ·geluK+132(SB)/4, $0x3f800000
DATA ·geluK+136(SB)/4, $0x3f800000
DATA ·geluK+140(SB)/4, $0x3f800000
DATA ·geluK+144(SB)/4, $0x3f800000
DATA ·geluK+148(SB)/4, $0x3f800000
DATA ·geluK+152(SB)/4, $0x3f800000
DATA ·geluK+156(SB)/4, $0x3f800000
DATA ·geluK+160(SB)/4, $0x411c0000 // hi = 9.75
DATA ·geluK+164(SB)/4, $0x411c0000
DATA ·geluK+168(SB)/4, $0x411c0000
DATA ·geluK+172(SB)/4, $0x411c0000
DATA ·geluK+176(SB)/4, $0x411c0000
DATA ·geluK+180(SB)/4, $0x411c0000
DATA ·geluK+184(SB)/4, $0x411c0000
DATA ·geluK+188(SB)/4, $0x411c0000
DATA ·geluK+192(SB)/4, $0xc11c0000 // lo = -9.75
DATA ·geluK+196(SB)/4, $0xc11c0000
DATA ·geluK+200(SB)/4, $0xc11c0000
DATA ·geluK+204(SB)/4, $0xc11c0000
DATA ·geluK+208(SB)/4, $0xc11c0000
DATA ·geluK+212(SB)/4, $0xc11c0000
DATA ·geluK+216(SB)/4, $0xc11c0000
DATA ·geluK+220(SB)/4, $0xc11c0000
DATA ·geluK+224(SB)/4, $0x3ba059dc // a1 = 0.00489352455891786
DATA ·geluK+228(SB)/4, $0x3ba059dc
DATA ·geluK+232(SB)/4, $0x3ba059dc
DATA ·geluK+236(SB)/4, $0x3ba059dc
DATA ·geluK+240(SB)/4, $0x3ba059dc
DATA ·geluK+244(SB)/4, $0x3ba059dc
DATA ·geluK+248(SB)/4, $0x3ba059dc
DATA ·geluK+252(SB)/4, $0x3ba059dc
DATA ·geluK+256(SB)/4, $0x3a270ded // a3 = 0.000637261928875436
DATA ·geluK+260(SB)/4, $0x3a270ded
DATA ·geluK+264(SB)/4, $0x3a270ded
DATA ·geluK+268(SB)/4, $0x3a270ded
DATA ·geluK+272(SB)/4, $0x3a270ded
DATA ·geluK+276(SB)/4, $0x3a270ded
DATA ·geluK+280(SB)/4, $0x3a270ded
DATA ·geluK+284(SB)/4, $0x3a270ded
DATA ·geluK+288(SB)/4, $0x3779434a // a5 = 1.48572235717979e-05
DATA ·geluK+292(SB)/4, $0x3779434a
DATA ·geluK+296(SB)/4, $0x3779434a
DATA ·geluK+300(SB)/4, $0x3779434a
DATA ·geluK+304(SB)/4, $0x3779434a
DATA ·geluK+308(SB)/4, $0x3779434a
DATA ·geluK+312(SB)/4, $0x3779434a
DATA ·geluK+316(SB)/4, $0x3779434a
DATA ·geluK+320(SB)/4, $0x335c0041 // a7 = 5.12229709037114e-08
DATA ·geluK+324(SB)/4, $0x335c0041
DATA ·geluK+328(SB)/4, $0x335c0041
DATA ·geluK+332(SB)/4, $0x335c0041
DATA ·geluK+336(SB)/4, $0x335c0041
DATA ·geluK+340(SB)/4, $0x335c0041
DATA ·geluK+344(SB)/4, $0x335c0041
DATA ·geluK+348(SB)/4, $0x335c0041
DATA ·geluK+352(SB)/4, $0xaebd37ff // a9 = -8.60467152213735e-11
DATA ·geluK+356(SB)/4, $0xaebd37ff
DATA ·geluK+360(SB)/4, $0xaebd37ff
DATA ·geluK+364(SB)/4, $0xaebd37ff
DATA ·geluK+368(SB)/4, $0xaebd37ff
DATA ·geluK+372(SB)/4, $0xaebd37ff
DATA ·geluK+376(SB)/4, $0xaebd37ff
DATA ·geluK+380(SB)/4, $0xaebd37ff
DATA ·geluK+384(SB)/4, $0x2a61337e // a11 = 2.00018790482477e-13
DATA ·geluK+388(SB)/4, $0x2a61337e
DATA ·geluK+392(SB)/4, $0x2a61337e
DATA ·geluK+396(SB)/4, $0x2a61337e
DATA ·geluK+400(SB)/4, $0x2a61337e
DATA ·geluK+404(SB)/4, $0x2a61337e
DATA ·geluK+408(SB)/4, $0x2a61337e
DATA ·geluK+412(SB)/4, $0x2a61337e
DATA ·geluK+416(SB)/4, $0xa59f25c0 // a13 = -2.76076847742355e-16
DATA ·geluK+420(SB)/4, $0xa59f25c0
DATA ·geluK+424(SB)/4, $0xa59f25c0
DATA ·geluK+428(SB)/4, $0xa59f25c0
DATA ·geluK+432(SB)/4, $0xa59f25c0
DATA ·geluK+436(SB)/4, $0xa59f25c0
DATA ·geluK+440(SB)/4, $0xa59f25c0
DATA ·geluK+444(SB)/4, $0xa59f25c0
DATA ·geluK+448(SB)/4, $0x3ba059dd // b0 = 0.00489352518554385
DATA ·geluK+452(SB)/4, $0x3ba059dd
DATA ·geluK+456(SB)/4, $0x3ba059dd
DATA ·geluK+460(SB)/4, $0x3ba059dd
DATA ·geluK+464(SB)/4, $0x3ba059dd
DATA ·geluK+468(SB)/4, $0x3ba059dd
DATA ·geluK+472(SB)/4, $0x3ba059dd
DATA ·geluK+476(SB)/4, $0x3ba059dd
DATA ·geluK+480(SB)/4, $0x3b14aa05 // b2 = 0.002268434632439
DATA ·geluK+484(SB)/4, $0x3b14aa05
DATA ·geluK+488(SB)/4, $0x3b14aa05
DATA ·geluK+492(SB)/4, $0x3b14aa05
DATA ·geluK+496(SB)/4, $0x3b14aa05
DATA ·geluK+500(SB)/4, $0x3b14aa05
DATA ·geluK+504(SB)/4, $0x3b14aa05
DATA ·geluK+508(SB)/4, $0x3b14aa05
DATA ·geluK+512(SB)/4, $0x38f895d6 // b4 = 0.000118534705686654
DATA ·geluK+516(SB)/4, $0x38f895d6
DATA ·geluK+520(SB)/4, $0x38f895d6
DATA ·geluK+524(SB)/4, $0x38f895d6
DATA ·geluK+528(SB)/4, $0x38f895d6
DATA ·geluK+532(SB)/4, $0x38f895d6
DATA ·geluK+536(SB)/4, $0x38f895d6
DATA ·geluK+540(SB)/4, $0x38f895d6
DATA ·geluK+544(SB)/4, $0x35a0d3d8 // b6 = 1.19825839466702e-06
DATA ·geluK+548(SB)/4, $0x35a0d3d8
DATA ·geluK+552(SB)/4, $0x35a0d3d8
DATA ·geluK+556(SB)/4, $0x35a0d3d8
DATA ·geluK+560(SB)/4, $0x35a0d3d8
DATA ·geluK+564(SB)/4, $0x35a0d3d8
DATA ·geluK+568(SB)/4, $0x35a0d3d8
DATA ·geluK+572(SB)/4, $0x35a0d3d8
DATA ·geluK+576(SB)/4, $0xbf800000 // negone = -1.0
DATA ·geluK+580(SB)/4, $0xbf800000
DATA ·geluK+584(SB)/4, $0xbf800000
DATA ·geluK+588(SB)/4, $0xbf800000
DATA ·geluK+592(SB)/4, $0xbf800000
DATA ·geluK+596(SB)/4, $0xbf800000
DATA ·geluK+600(SB)/4, $0xbf800000
DATA ·geluK+604(SB)/4, $0xbf800000
GLOBL ·geluK(SB), RODATA|NOPTR, $608

// func geluForwardAVX2(y, x *float32, n int)
//
// y[i] = gelu_tanh(x[i]) for i < n, n a multiple of 8. Y0 holds x, Y1
// x², Y2 ½x, Y3 u then t, Y4–Y6 the polynomials.
TEXT ·geluForwardAVX2(SB), NOSPLIT, $0-24
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ fwddone
fwdloop:
	VMOVUPS (SI), Y0
	VMULPS Y0, Y0, Y1
	VMOVUPS ·geluK+32(SB), Y3
	VFMADD213PS ·geluK+0(SB), Y1, Y3 // c + c·a·x²
	VMULPS Y0, Y3, Y3 // u
	VMINPS ·geluK+160(SB), Y3, Y3
	VMAXPS ·geluK+192(SB), Y3, Y3
	VMULPS Y3, Y3, Y4 // u²
	VMOVUPS ·geluK+416(SB), Y5
	VMOVUPS ·geluK+544(SB), Y6
	VFMADD213PS ·geluK+384(SB), Y4, Y5
	VFMADD213PS ·geluK+512(SB), Y4, Y6
	VFMADD213PS ·geluK+352(SB), Y4, Y5
	VFMADD213PS ·geluK+480(SB), Y4, Y6
	VFMADD213PS ·geluK+320(SB), Y4, Y5
	VFMADD213PS ·geluK+448(SB), Y4, Y6
	VFMADD213PS ·geluK+288(SB), Y4, Y5
	VFMADD213PS ·geluK+256(SB), Y4, Y5
	VFMADD213PS ·geluK+224(SB), Y4, Y5
	VMULPS Y3, Y5, Y5
	VDIVPS Y6, Y5, Y3 // t = p/q
	VMINPS ·geluK+128(SB), Y3, Y3 // at most 1
	VMAXPS ·geluK+576(SB), Y3, Y3 // at least −1
	VMULPS ·geluK+96(SB), Y0, Y2
	VFMADD213PS Y2, Y2, Y3 // ½x·t + ½x
	VMOVUPS Y3, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ fwdloop
fwddone:
	VZEROUPPER
	RET

// func geluBackwardAVX2(gx, x, gy *float32, n int)
//
// gx[i] = gy[i]·gelu_tanh'(x[i]) for i < n, n a multiple of 8:
// ½(1+t) + ½x(1−t²)·(c + 3c·a·x²). Y0 holds x, Y1 x², Y2 ½x, Y3 u then
// t, Y4–Y6 the polynomials, Y7 the derivative.
TEXT ·geluBackwardAVX2(SB), NOSPLIT, $0-32
	MOVQ gx+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ gy+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JZ bwddone
bwdloop:
	VMOVUPS (SI), Y0
	VMULPS Y0, Y0, Y1
	VMOVUPS ·geluK+32(SB), Y3
	VFMADD213PS ·geluK+0(SB), Y1, Y3
	VMULPS Y0, Y3, Y3 // u
	VMINPS ·geluK+160(SB), Y3, Y3
	VMAXPS ·geluK+192(SB), Y3, Y3
	VMULPS Y3, Y3, Y4 // u²
	VMOVUPS ·geluK+416(SB), Y5
	VMOVUPS ·geluK+544(SB), Y6
	VFMADD213PS ·geluK+384(SB), Y4, Y5
	VFMADD213PS ·geluK+512(SB), Y4, Y6
	VFMADD213PS ·geluK+352(SB), Y4, Y5
	VFMADD213PS ·geluK+480(SB), Y4, Y6
	VFMADD213PS ·geluK+320(SB), Y4, Y5
	VFMADD213PS ·geluK+448(SB), Y4, Y6
	VFMADD213PS ·geluK+288(SB), Y4, Y5
	VFMADD213PS ·geluK+256(SB), Y4, Y5
	VFMADD213PS ·geluK+224(SB), Y4, Y5
	VMULPS Y3, Y5, Y5
	VDIVPS Y6, Y5, Y3 // t = p/q
	VMINPS ·geluK+128(SB), Y3, Y3 // at most 1
	VMAXPS ·geluK+576(SB), Y3, Y3 // at least −1
	VMOVUPS ·geluK+64(SB), Y7
	VFMADD213PS ·geluK+0(SB), Y1, Y7 // c + 3c·a·x²
	VMOVAPS Y3, Y4
	VFNMADD213PS ·geluK+128(SB), Y3, Y4 // 1 − t²
	VMULPS Y4, Y7, Y7
	VMULPS ·geluK+96(SB), Y0, Y2
	VMULPS Y2, Y7, Y7 // ½x(1−t²)(c + 3c·a·x²)
	VFMADD231PS ·geluK+96(SB), Y3, Y7 // + ½t
	VADDPS ·geluK+96(SB), Y7, Y7 // + ½
	VMULPS (DX), Y7, Y7
	VMOVUPS Y7, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ bwdloop
bwddone:
	VZEROUPPER
	RET
