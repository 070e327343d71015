package cpu

import "math"

// The row pieces of layer_norm, forward and backward, in float64 as the
// CPU device's kernels (gpuhost's cpu_kernels.go) need them, split by
// rowRuns: on a path with
// asm (AVX2 and FMA present), the whole runs of 8 go to the kernels in
// layernorm_amd64.s and the tail to the Go loop, which is the whole row
// otherwise; on the AVX-512 path (wide), the whole runs of 16 go to
// layernorm512_amd64.s first and a run of 8 left after them to the AVX2
// kernel. The vector code adds in another order, so sums differ from the
// Go loop's in the last bits of a float64.

// rowRuns splits a row of n elements among the kernels of path p: [0,
// n16) to the AVX-512 one, [n16, n8) (empty or one run of 8) to the AVX2
// one and [n8, n) to Go.
func rowRuns(n int, p Path) (n16, n8 int) {
	if p.Wide() {
		n16 = n &^ 15
	}
	if p.Asm() {
		n8 = n &^ 7
	}
	return n16, n8
}

// RowSum returns Σ x.
func RowSum(x []float32, p Path) float64 {
	var s float64
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		s = sumF64AVX512(&x[0], n16)
	}
	if n8 > n16 {
		s += sumF64AVX2(&x[n16], n8-n16)
	}
	for _, v := range x[n8:] {
		s += float64(v)
	}
	return s
}

// AddRowSum sets s = x + r in float32 and returns Σ s.
func AddRowSum(s, x, r []float32, p Path) float64 {
	s, r = s[:len(x)], r[:len(x)]
	var sum float64
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		sum = addSumF64AVX512(&s[0], &x[0], &r[0], n16)
	}
	if n8 > n16 {
		sum += addSumF64AVX2(&s[n16], &x[n16], &r[n16], n8-n16)
	}
	for i := n8; i < len(x); i++ {
		v := x[i] + r[i]
		s[i] = v
		sum += float64(v)
	}
	return sum
}

// NormRow normalises x, whose elements sum to sum, into y =
// (x − mean)·rstd·w + b with a second pass for the variance, so that a
// large mean does not eat it, and returns mean and rstd. y may be x.
func NormRow(y, x, w, b []float32, eps, sum float64, p Path) (mean, rstd float64) {
	h := float64(len(x))
	m := sum / h
	var q float64
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		q = sqDevF64AVX512(&x[0], n16, m)
	}
	if n8 > n16 {
		q += sqDevF64AVX2(&x[n16], n8-n16, m)
	}
	for _, v := range x[n8:] {
		dv := float64(v) - m
		q += dv * dv
	}
	inv := 1 / math.Sqrt(q/h+eps)
	b, w, y = b[:len(x)], w[:len(x)], y[:len(x)]
	if n16 > 0 {
		lnApplyAVX512(&y[0], &x[0], &w[0], &b[0], n16, m, inv)
	}
	if n8 > n16 {
		lnApplyAVX2(&y[n16], &x[n16], &w[n16], &b[n16], n8-n16, m, inv)
	}
	for i := n8; i < len(x); i++ {
		y[i] = float32((float64(x[i])-m)*inv)*w[i] + b[i]
	}
	return m, inv
}

// NormRowGrad sets gx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)) for one row, with
// ĝ = gy·w and x̂ = (x − mean)·rstd.
func NormRowGrad(gx, x, gy, w []float32, m, inv float64, p Path) {
	gx, gy, w = gx[:len(x)], gy[:len(x)], w[:len(x)]
	var sg, sgx float64
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		sg, sgx = lnBwdSumsAVX512(&x[0], &gy[0], &w[0], n16, m, inv)
	}
	if n8 > n16 {
		g8, gx8 := lnBwdSumsAVX2(&x[n16], &gy[n16], &w[n16], n8-n16, m, inv)
		sg += g8
		sgx += gx8
	}
	for i := n8; i < len(x); i++ {
		gh := float64(gy[i]) * float64(w[i])
		sg += gh
		sgx += gh * (float64(x[i]) - m) * inv
	}
	h := float64(len(x))
	sg /= h
	sgx /= h
	if n16 > 0 {
		lnBwdApplyAVX512(&gx[0], &x[0], &gy[0], &w[0], n16, m, inv, sg, sgx)
	}
	if n8 > n16 {
		lnBwdApplyAVX2(&gx[n16], &x[n16], &gy[n16], &w[n16], n8-n16, m, inv, sg, sgx)
	}
	for i := n8; i < len(x); i++ {
		xh := (float64(x[i]) - m) * inv
		gh := float64(gy[i]) * float64(w[i])
		gx[i] = float32(inv * (gh - sg - xh*sgx))
	}
}

// NormColsGrad adds one row's share of the weight and bias gradients:
// sw += gy·x̂, sb += gy.
func NormColsGrad(sw, sb []float64, x, gy []float32, m, inv float64, p Path) {
	sw, sb, gy = sw[:len(x)], sb[:len(x)], gy[:len(x)]
	n16, n8 := rowRuns(len(x), p)
	if n16 > 0 {
		lnBwdColsAVX512(&sw[0], &sb[0], &x[0], &gy[0], n16, m, inv)
	}
	if n8 > n16 {
		lnBwdColsAVX2(&sw[n16], &sb[n16], &x[n16], &gy[n16], n8-n16, m, inv)
	}
	for i := n8; i < len(x); i++ {
		gv := float64(gy[i])
		sw[i] += gv * (float64(x[i]) - m) * inv
		sb[i] += gv
	}
}
