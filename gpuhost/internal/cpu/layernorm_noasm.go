//go:build !amd64 || purego

package cpu

// The layer_norm row kernels exist so that layernorm.go compiles; they are
// never called because every Path's Asm and Wide are false in this build.

func sumF64AVX2(x *float32, n int) float64                   { panic(noAsm) }
func addSumF64AVX2(s, x, r *float32, n int) float64          { panic(noAsm) }
func sqDevF64AVX2(x *float32, n int, m float64) float64      { panic(noAsm) }
func lnApplyAVX2(y, x, w, b *float32, n int, m, inv float64) { panic(noAsm) }
func lnBwdSumsAVX2(x, gy, w *float32, n int, m, inv float64) (sg, sgx float64) {
	panic(noAsm)
}
func lnBwdApplyAVX2(o, x, gy, w *float32, n int, m, inv, sg, sgx float64)  { panic(noAsm) }
func lnBwdColsAVX2(sw, sb *float64, x, gy *float32, n int, m, inv float64) { panic(noAsm) }

const noAsm = "BUG: gpuhost: vector kernel called in a build without it"

func expSumAVX2(x *float32, n int, m float64) float64   { panic(noAsm) }
func expScaleAVX2(y, x *float32, n int, m, inv float64) { panic(noAsm) }

func dotF64AVX2(x, y *float32, n int) float64              { panic(noAsm) }
func softmaxGradAVX2(gx, y, gy *float32, n int, s float64) { panic(noAsm) }
func addF32AVX2(dst, x, y *float32, n int)                 { panic(noAsm) }

func sumF64AVX512(x *float32, n int) float64                   { panic(noAsm) }
func addSumF64AVX512(s, x, r *float32, n int) float64          { panic(noAsm) }
func sqDevF64AVX512(x *float32, n int, m float64) float64      { panic(noAsm) }
func lnApplyAVX512(y, x, w, b *float32, n int, m, inv float64) { panic(noAsm) }
func lnBwdSumsAVX512(x, gy, w *float32, n int, m, inv float64) (sg, sgx float64) {
	panic(noAsm)
}
func lnBwdApplyAVX512(o, x, gy, w *float32, n int, m, inv, sg, sgx float64)  { panic(noAsm) }
func lnBwdColsAVX512(sw, sb *float64, x, gy *float32, n int, m, inv float64) { panic(noAsm) }

func expSumAVX512(x *float32, n int, m float64) float64      { panic(noAsm) }
func expScaleAVX512(y, x *float32, n int, m, inv float64)    { panic(noAsm) }
func dotF64AVX512(x, y *float32, n int) float64              { panic(noAsm) }
func softmaxGradAVX512(gx, y, gy *float32, n int, s float64) { panic(noAsm) }
func addF32AVX512(dst, x, y *float32, n int)                 { panic(noAsm) }
