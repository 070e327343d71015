//go:build cuda || cudaemu

package cuda

// blasCall is a GEMM as a column-major BLAS (cuBLAS) takes it:
// C = op(A)·op(B) with A, B and C column-major.
type blasCall struct {
	ta, tb  bool
	m, n, k int
	a       Ptr
	lda     int
	strideA int64
	b       Ptr
	ldb     int
	strideB int64
}

// toColMajor turns a row-major GEMM (the driver's Sgemm) into the
// column-major call that computes it. A row-major matrix read as
// column-major is its transpose, so C (m×n, row-major) is Cᵀ (n×m,
// column-major) = op(B)ᵀ·op(A)ᵀ: the operands swap, and so do m and n,
// each keeping its own transpose flag and leading dimension. C's
// pointer, leading dimension and stride stay as they are.
func toColMajor(ta, tb bool, m, n, k int, a Ptr, lda int, strideA int64, b Ptr, ldb int, strideB int64) blasCall {
	return blasCall{ta: tb, tb: ta, m: n, n: m, k: k, a: b, lda: ldb, strideA: strideB, b: a, ldb: lda, strideB: strideA}
}
