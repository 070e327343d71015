//go:build amd64 && !purego

package cpu

// The AVX2 row kernels of layer_norm, in layernorm_amd64.s. Each takes n,
// a multiple of 8, and pointers to at least n elements; the *Vec wrappers
// in layernorm.go check lengths and run the tail in Go.

//go:noescape
func sumF64AVX2(x *float32, n int) float64

//go:noescape
func addSumF64AVX2(s, x, r *float32, n int) float64

//go:noescape
func sqDevF64AVX2(x *float32, n int, m float64) float64

//go:noescape
func lnApplyAVX2(y, x, w, b *float32, n int, m, inv float64)

//go:noescape
func lnBwdSumsAVX2(x, gy, w *float32, n int, m, inv float64) (sg, sgx float64)

//go:noescape
func lnBwdApplyAVX2(o, x, gy, w *float32, n int, m, inv, sg, sgx float64)

//go:noescape
func lnBwdColsAVX2(sw, sb *float64, x, gy *float32, n int, m, inv float64)

// Their AVX-512F versions, in layernorm512_amd64.s, for n a multiple of
// 16; the wrappers run them on the wide path (Path.Wide) only.

//go:noescape
func sumF64AVX512(x *float32, n int) float64

//go:noescape
func addSumF64AVX512(s, x, r *float32, n int) float64

//go:noescape
func sqDevF64AVX512(x *float32, n int, m float64) float64

//go:noescape
func lnApplyAVX512(y, x, w, b *float32, n int, m, inv float64)

//go:noescape
func lnBwdSumsAVX512(x, gy, w *float32, n int, m, inv float64) (sg, sgx float64)

//go:noescape
func lnBwdApplyAVX512(o, x, gy, w *float32, n int, m, inv, sg, sgx float64)

//go:noescape
func lnBwdColsAVX512(sw, sb *float64, x, gy *float32, n int, m, inv float64)

// expSumAVX2 returns Σ e^(x−m) in float64 for n, a multiple of 8, and
// m finite and at least every x. Implemented in softmax_amd64.s.
//
//go:noescape
func expSumAVX2(x *float32, n int, m float64) float64

// expScaleAVX2 sets y = float32(e^(x−m)·inv), as expSumAVX2. Implemented
// in softmax_amd64.s.
//
//go:noescape
func expScaleAVX2(y, x *float32, n int, m, inv float64)

// dotF64AVX2 returns Σ x·y in float64 for n, a multiple of 8. Implemented
// in softmax_amd64.s.
//
//go:noescape
func dotF64AVX2(x, y *float32, n int) float64

// softmaxGradAVX2 sets gx = float32(y·(gy − s)), computed in float64, for
// n a multiple of 8. Implemented in softmax_amd64.s.
//
//go:noescape
func softmaxGradAVX2(gx, y, gy *float32, n int, s float64)

// addF32AVX2 sets dst = x + y for n, a multiple of 8; dst may be x or y.
// Implemented in softmax_amd64.s.
//
//go:noescape
func addF32AVX2(dst, x, y *float32, n int)

// The AVX-512F versions of softmax's kernels and addF32AVX2, in
// softmax512_amd64.s: the same, for n a multiple of 16.

//go:noescape
func expSumAVX512(x *float32, n int, m float64) float64

//go:noescape
func expScaleAVX512(y, x *float32, n int, m, inv float64)

//go:noescape
func dotF64AVX512(x, y *float32, n int) float64

//go:noescape
func softmaxGradAVX512(gx, y, gy *float32, n int, s float64)

//go:noescape
func addF32AVX512(dst, x, y *float32, n int)
