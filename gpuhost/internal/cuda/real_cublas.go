//go:build cuda && !cudaemu

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// The few cuBLAS entry points the device uses, declared here instead of
// taken from cublas_v2.h: their ABI has been stable since CUDA 8, and the
// library is found at run time, so the build needs no cuBLAS headers.
typedef int (*moe_cublas_create_fn)(void **handle);
typedef int (*moe_cublas_destroy_fn)(void *handle);
typedef int (*moe_cublas_set_stream_fn)(void *handle, void *stream);
typedef int (*moe_cublas_set_math_mode_fn)(void *handle, int mode);
typedef int (*moe_cublas_sgemm_fn)(void *handle, int ta, int tb, int m, int n, int k,
	const float *alpha, const float *a, int lda, const float *b, int ldb,
	const float *beta, float *c, int ldc);
typedef int (*moe_cublas_sgemm_sb_fn)(void *handle, int ta, int tb, int m, int n, int k,
	const float *alpha, const float *a, int lda, long long sa, const float *b, int ldb, long long sb,
	const float *beta, float *c, int ldc, long long sc, int batch);

typedef struct {
	void *lib;
	moe_cublas_create_fn create;
	moe_cublas_destroy_fn destroy;
	moe_cublas_set_stream_fn set_stream;
	moe_cublas_set_math_mode_fn set_math_mode;
	moe_cublas_sgemm_fn sgemm;
	moe_cublas_sgemm_sb_fn sgemm_sb;
} moe_cublas;

// moe_dlopen_global loads a library whose symbols later libraries may
// need (cublasLt, before a cuBLAS found by path). NULL on failure.
static void *moe_dlopen_global(const char *path) {
	return dlopen(path, RTLD_NOW | RTLD_GLOBAL);
}

// moe_cublas_open fills t from the library at path. It returns NULL, or
// the loader's message, or the name of a missing symbol.
static const char *moe_cublas_open(const char *path, moe_cublas *t) {
	t->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (t->lib == NULL) {
		const char *e = dlerror();
		return e != NULL ? e : "dlopen failed";
	}
#define MOE_SYM(field, type, name) \
	t->field = (type)dlsym(t->lib, name); \
	if (t->field == NULL) { dlclose(t->lib); t->lib = NULL; return name; }
	MOE_SYM(create, moe_cublas_create_fn, "cublasCreate_v2")
	MOE_SYM(destroy, moe_cublas_destroy_fn, "cublasDestroy_v2")
	MOE_SYM(set_stream, moe_cublas_set_stream_fn, "cublasSetStream_v2")
	MOE_SYM(set_math_mode, moe_cublas_set_math_mode_fn, "cublasSetMathMode")
	MOE_SYM(sgemm, moe_cublas_sgemm_fn, "cublasSgemm_v2")
	MOE_SYM(sgemm_sb, moe_cublas_sgemm_sb_fn, "cublasSgemmStridedBatched")
#undef MOE_SYM
	return NULL;
}

static int moe_cublas_create(moe_cublas *t, void **h) { return t->create(h); }
static int moe_cublas_destroy(moe_cublas *t, void *h) { return t->destroy(h); }
static int moe_cublas_set_stream(moe_cublas *t, void *h, void *s) { return t->set_stream(h, s); }
static int moe_cublas_set_math_mode(moe_cublas *t, void *h, int mode) { return t->set_math_mode(h, mode); }

// alpha and beta are host scalars (cuBLAS's default pointer mode).
static int moe_cublas_sgemm(moe_cublas *t, void *h, int ta, int tb, int m, int n, int k,
		float alpha, uintptr_t a, int lda, uintptr_t b, int ldb, float beta, uintptr_t c, int ldc) {
	return t->sgemm(h, ta, tb, m, n, k, &alpha, (const float *)a, lda, (const float *)b, ldb,
		&beta, (float *)c, ldc);
}

static int moe_cublas_sgemm_sb(moe_cublas *t, void *h, int ta, int tb, int m, int n, int k,
		float alpha, uintptr_t a, int lda, long long sa, uintptr_t b, int ldb, long long sb,
		float beta, uintptr_t c, int ldc, long long sc, int batch) {
	return t->sgemm_sb(h, ta, tb, m, n, k, &alpha, (const float *)a, lda, sa, (const float *)b, ldb, sb,
		&beta, (float *)c, ldc, sc, batch);
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// cublasSonames are tried in order: the newest first, so that a binary
// built against CUDA 11.8 here uses the GPU machine's cuBLAS 13.
var cublasSonames = []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}

// cuBLAS constants (cublas_api.h).
const (
	cublasOpN = 0
	cublasOpT = 1
	// cublasDefaultMath is plain fp32 for Sgemm: no TF32 tensor cores
	// (that is CUBLAS_TF32_TENSOR_OP_MATH, 3, which we never set) and no
	// emulation. It is what PyTorch uses with allow_tf32 off.
	cublasDefaultMath = 0

	cublasStatusAllocFailed = 3
)

// cublasLib is the loaded library, shared by every context.
type cublasLib struct {
	path string
	t    *C.moe_cublas // C memory: cgo calls may not take Go pointers to it across calls
}

var (
	cublasOnce   sync.Once
	cublasLoaded *cublasLib
	cublasErr    error
)

// cublasCandidates lists what loadCublas tries: each of paths, a
// directory standing for each soname in it; then each soname through the
// loader's own search (LD_LIBRARY_PATH, the ld.so cache).
func cublasCandidates(paths []string) []string {
	var out []string
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			for _, s := range cublasSonames {
				out = append(out, filepath.Join(p, s))
			}
			continue
		}
		out = append(out, p)
	}
	return append(out, cublasSonames...)
}

// loadCublas loads cuBLAS once per process, from the first of paths
// (cublasCandidates) that loads: a later call's paths are not looked at.
func loadCublas(paths []string) (*cublasLib, error) {
	cublasOnce.Do(func() {
		t := (*C.moe_cublas)(C.calloc(1, C.size_t(unsafe.Sizeof(C.moe_cublas{}))))
		var tried []string
		for _, cand := range cublasCandidates(paths) {
			if strings.Contains(cand, "/") {
				// cuBLAS needs cublasLt from its own directory, which
				// the loader may not search: load it first, globally.
				lt := strings.Replace(filepath.Base(cand), "libcublas", "libcublasLt", 1)
				cl := C.CString(filepath.Join(filepath.Dir(cand), lt))
				C.moe_dlopen_global(cl)
				C.free(unsafe.Pointer(cl))
			}
			cs := C.CString(cand)
			msg := C.moe_cublas_open(cs, t)
			C.free(unsafe.Pointer(cs))
			if msg == nil {
				cublasLoaded = &cublasLib{path: cand, t: t}
				return
			}
			tried = append(tried, fmt.Sprintf("%s (%s)", cand, C.GoString(msg)))
		}
		C.free(unsafe.Pointer(t))
		cublasErr = fmt.Errorf("cuda: cuBLAS not found; set MOEHOST_CUBLAS to its path or add its directory to LD_LIBRARY_PATH; tried %s", strings.Join(tried, "; "))
	})
	return cublasLoaded, cublasErr
}

// cublasHandle is one context's handle. Its methods run on the driver
// goroutine, with the context current.
type cublasHandle struct {
	lib *cublasLib
	h   unsafe.Pointer
}

func blasError(status C.int, what string) error {
	if status == 0 {
		return nil
	}
	if status == cublasStatusAllocFailed {
		return fmt.Errorf("%w: cuBLAS %s: status %d (alloc failed)", ErrOutOfMemory, what, int(status))
	}
	return fmt.Errorf("cuda: cuBLAS %s: status %d", what, int(status))
}

// newHandle creates a handle for the current context, on stream, with
// default (never TF32) math.
func (l *cublasLib) newHandle(stream unsafe.Pointer) (*cublasHandle, error) {
	var h unsafe.Pointer
	if err := blasError(C.moe_cublas_create(l.t, &h), "create ("+l.path+")"); err != nil {
		return nil, err
	}
	hd := &cublasHandle{lib: l, h: h}
	if err := blasError(C.moe_cublas_set_stream(l.t, h, stream), "set stream"); err != nil {
		hd.destroy()
		return nil, err
	}
	if err := blasError(C.moe_cublas_set_math_mode(l.t, h, cublasDefaultMath), "set math mode"); err != nil {
		hd.destroy()
		return nil, err
	}
	return hd, nil
}

func (h *cublasHandle) destroy() { C.moe_cublas_destroy(h.lib.t, h.h) }

func blasOp(t bool) C.int {
	if t {
		return cublasOpT
	}
	return cublasOpN
}

// sgemm is cublasSgemm_v2, column-major.
func (h *cublasHandle) sgemm(ta, tb bool, m, n, k int, alpha float32, a Ptr, lda int, b Ptr, ldb int, beta float32, c Ptr, ldc int) error {
	st := C.moe_cublas_sgemm(h.lib.t, h.h, blasOp(ta), blasOp(tb), C.int(m), C.int(n), C.int(k),
		C.float(alpha), C.uintptr_t(a), C.int(lda), C.uintptr_t(b), C.int(ldb), C.float(beta), C.uintptr_t(c), C.int(ldc))
	return blasError(st, fmt.Sprintf("sgemm m=%d n=%d k=%d", m, n, k))
}

// sgemmStridedBatched is cublasSgemmStridedBatched, column-major.
func (h *cublasHandle) sgemmStridedBatched(ta, tb bool, m, n, k int, alpha float32, a Ptr, lda int, sa int64, b Ptr, ldb int, sb int64, beta float32, c Ptr, ldc int, sc int64, batch int) error {
	st := C.moe_cublas_sgemm_sb(h.lib.t, h.h, blasOp(ta), blasOp(tb), C.int(m), C.int(n), C.int(k),
		C.float(alpha), C.uintptr_t(a), C.int(lda), C.longlong(sa), C.uintptr_t(b), C.int(ldb), C.longlong(sb),
		C.float(beta), C.uintptr_t(c), C.int(ldc), C.longlong(sc), C.int(batch))
	return blasError(st, fmt.Sprintf("sgemm batched m=%d n=%d k=%d batch=%d", m, n, k, batch))
}
