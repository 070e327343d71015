//go:build openblas && cgo

// Package openblas calls OpenBLAS's SGEMM through cgo, for gpuhost's
// optional OpenBLAS device (-tags openblas). It is a package of its own
// because a package that uses cgo cannot hold Go assembly.
package openblas

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
*/
import "C"

import (
	"sync"
	"unsafe"
)

// state guards OpenBLAS's thread count, which is process-wide: each GEMM
// sets it to its caller's threads and runs under the lock, so callers with
// different counts never race. Calls from one process are serialised.
var state struct {
	sync.Mutex
	threads int
}

// Sgemm computes c (+)= op(a)·op(b) with cblas_sgemm on threads threads,
// in the layout of gpuhost's kernels.gemm: row-major, a is m×k (k×m when
// ta), b is k×n (n×k when tb), c is m×n.
func Sgemm(threads int, ta, tb bool, m, n, k int, a, b, c []float32, acc bool) {
	lda, ldb := k, n
	transA, transB := uint32(C.CblasNoTrans), uint32(C.CblasNoTrans)
	if ta {
		lda, transA = m, C.CblasTrans
	}
	if tb {
		ldb, transB = k, C.CblasTrans
	}
	beta := C.float(0)
	if acc {
		beta = 1
	}
	_, _ = a[m*k-1], b[k*n-1] // bounds, since C reads without checks
	_ = c[m*n-1]
	state.Lock()
	defer state.Unlock()
	if state.threads != threads {
		C.openblas_set_num_threads(C.int(threads))
		state.threads = threads
	}
	C.cblas_sgemm(C.CblasRowMajor, transA, transB, C.blasint(m), C.blasint(n), C.blasint(k),
		1, (*C.float)(unsafe.Pointer(&a[0])), C.blasint(lda),
		(*C.float)(unsafe.Pointer(&b[0])), C.blasint(ldb),
		beta, (*C.float)(unsafe.Pointer(&c[0])), C.blasint(n))
}

// Config returns OpenBLAS's description of itself: the kernel it chose for
// this CPU (openblas_get_corename, "Haswell", "Zen", "SkylakeX"…) and its
// build configuration (openblas_get_config).
func Config() (core, config string) {
	return C.GoString(C.openblas_get_corename()), C.GoString(C.openblas_get_config())
}
