// emu.h is the CUDA built-in set that the emulator (build tag cudaemu)
// gives kernels/moehost.cu when it compiles it as C++ for the CPU. It holds
// exactly what the kernels may use (see cuda-plan in the package doc):
// the thread and block indices, __shared__, __syncthreads, atomicAdd on
// float and the single-precision math. Anything else fails to compile
// here, which is the point: a kernel that builds under the emulator uses
// nothing the emulator cannot run faithfully.
//
// Only emu_launch.cpp includes this file, right before moehost.cu.
#pragma once

#define MOEHOST_CUDA_EMU 1

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Static __shared__ arrays are block-scope thread_local variables (and so
// static): the fibers of one block run on one OS thread and see one copy,
// and blocks run one after another, so every block has the array to
// itself. A concurrent launch on another OS thread has its own.
#define __shared__ thread_local

// dim3 is CUDA's three-part size.
struct dim3 {
  unsigned int x, y, z;
};

// The indices of the running fiber; the scheduler sets them before it
// resumes one.
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
// moe_emu_dyn_shared is the launch's dynamic shared memory (sharedBytes,
// filled with 0xff bytes so that a read before a write shows).
extern thread_local unsigned char *moe_emu_dyn_shared;

// __syncthreads is a barrier of the block: the fiber yields, and resumes
// once every other thread of the block reached the barrier or ended.
void __syncthreads();

// atomicAdd needs no lock: a block's fibers share one OS thread and
// switch only at barriers, and the context runs one launch at a time.
static inline float atomicAdd(float *p, float v) {
  float old = *p;
  *p = old + v;
  return old;
}

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// The rounded arithmetic intrinsics. emu_launch.cpp turns off the host
// compiler's contraction into fused multiply-adds for the whole file.
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
// glibc declares __expf and __logf itself.
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __int_as_float(int i) {
  float f;
  __builtin_memcpy(&f, &i, 4);
  return f;
}
static inline int __float_as_int(float f) {
  int i;
  __builtin_memcpy(&i, &f, 4);
  return i;
}

// CUDA's device min and max overloads.
#define MOE_EMU_MINMAX(T)                                                    \
  static inline T min(T a, T b) { return a < b ? a : b; }                    \
  static inline T max(T a, T b) { return a > b ? a : b; }
MOE_EMU_MINMAX(int)
MOE_EMU_MINMAX(unsigned int)
MOE_EMU_MINMAX(long long)
MOE_EMU_MINMAX(unsigned long long)
MOE_EMU_MINMAX(float)
MOE_EMU_MINMAX(double)
#undef MOE_EMU_MINMAX

// MOE_EXTERN_SHARED declares the launch's dynamic shared memory as a T*
// named name (nvcc: extern __shared__ T name[]; see prelude.cuh).
#define MOE_EXTERN_SHARED(T, name) T *name = reinterpret_cast<T *>(moe_emu_dyn_shared)

// moe_emu_register adds a kernel to the emulator's registry, under its
// name, with its parameter types (one letter each: p pointer, i int,
// l long long, u unsigned, f float, d double) and a call that unpacks
// void** arguments. MOE_EMU_KERNEL (below) builds the call.
typedef void (*moe_emu_call)(void **args);
int moe_emu_register(const char *name, const char *sig, moe_emu_call call);

#include <type_traits>
#include <utility>

template <typename T> struct moe_emu_code;
template <typename T> struct moe_emu_code<T *> {
  static constexpr char c = 'p';
};
template <> struct moe_emu_code<int> {
  static constexpr char c = 'i';
};
template <> struct moe_emu_code<long long> {
  static constexpr char c = 'l';
};
template <> struct moe_emu_code<unsigned int> {
  static constexpr char c = 'u';
};
template <> struct moe_emu_code<float> {
  static constexpr char c = 'f';
};
template <> struct moe_emu_code<double> {
  static constexpr char c = 'd';
};

template <typename F> struct moe_emu_wrap;
template <typename... A> struct moe_emu_wrap<void (*)(A...)> {
  // sig is the parameter letters, NUL-terminated.
  static constexpr char sig[] = {moe_emu_code<std::remove_cv_t<A>>::c..., 0};
  template <void (*K)(A...), size_t... I>
  static void unpack(void **args, std::index_sequence<I...>) {
    K(*static_cast<std::remove_cv_t<A> *>(args[I])...);
  }
  template <void (*K)(A...)> static void call(void **args) {
    unpack<K>(args, std::index_sequence_for<A...>{});
  }
};

// MOE_EMU_KERNEL(k) registers kernel k at start-up. emu_kernels.h, which
// internal/emugen generates from the kernel files, has one line for each;
// the emulator's tests fail when it misses one.
#define MOE_EMU_KERNEL(k)                                                    \
  static const int moe_emu_reg_##k = moe_emu_register(                      \
      #k, moe_emu_wrap<decltype(&k)>::sig,                                   \
      &moe_emu_wrap<decltype(&k)>::template call<&k>);
