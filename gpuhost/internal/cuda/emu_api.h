// emu_api.h is the C interface between emu.go and the emulator's C++
// (emu_launch.cpp). Device addresses are uintptr_t: C heap memory.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// moe_emu_alloc returns bytes of memory aligned to 256, or 0, followed
// by a guard that moe_emu_guard_ok checks (0 when something wrote on it).
uintptr_t moe_emu_alloc(int64_t bytes);
int moe_emu_guard_ok(uintptr_t p, int64_t bytes);
void moe_emu_free(uintptr_t p);
void moe_emu_copy(uintptr_t dst, uintptr_t src, int64_t bytes);
void moe_emu_memset32(uintptr_t dst, uint32_t v, int64_t n);

// moe_emu_launch runs kernel name over grid×block threads, with args[i]
// pointing at the i-th argument's value and sig naming their types (see
// emu.h). It returns 0, or -1 with a message in err.
int moe_emu_launch(const char *name, unsigned gx, unsigned gy, unsigned gz,
                   unsigned bx, unsigned by, unsigned bz, unsigned shared,
                   const char *sig, void **args, char *err, int errlen);

// moe_emu_kernels writes the registered kernels' names, each followed by
// a newline, into buf and returns the length it needs.
int moe_emu_kernels(char *buf, int len);

// moe_emu_sgemm is row-major C = alpha·op(A)·op(B) + beta·C for batch
// matrices at the given strides; beta 0 never reads C.
void moe_emu_sgemm(int ta, int tb, int m, int n, int k, float alpha,
                   uintptr_t a, int lda, int64_t sa, uintptr_t b, int ldb,
                   int64_t sb, float beta, uintptr_t c, int ldc, int64_t sc,
                   int batch);

#ifdef __cplusplus
}
#endif
