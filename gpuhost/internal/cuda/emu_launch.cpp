//go:build cudaemu

// emu_launch.cpp runs the CUDA device's kernels on the CPU: it compiles
// kernels/moehost.cu as C++ under emu.h's built-ins, keeps a registry of
// the kernels by name, and launches one as CUDA would, block after block
// (the last first), each block's threads as cooperative fibers so that
// __syncthreads is a real barrier.
//
// Between two barriers the scheduler resumes a block's fibers in a
// shuffled order (fixed for a given block and barrier, so runs repeat), and
// each runs until it reaches the next barrier or ends; so a kernel that
// counts on thread 0 running first, or that reads what another thread
// writes without a barrier between, reads stale data here as it may on a
// GPU.

// No fused multiply-adds: __fmul_rn and friends must round each step, as
// they do on a GPU. (cgo's flag allow-list has no -ffp-contract.)
#pragma GCC optimize("fp-contract=off")

#include "emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "emu_api.h"

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
thread_local unsigned char *moe_emu_dyn_shared;

namespace {

struct kernel {
  std::string sig;
  moe_emu_call call;
};

std::map<std::string, kernel> &registry() {
  static std::map<std::string, kernel> r;
  return r;
}

// Fibers. On x86-64 a switch is six pushes, a stack swap and six pops
// (swapcontext would add a signal-mask system call to each); elsewhere
// ucontext does it.
#if defined(__x86_64__) && !defined(MOE_EMU_UCONTEXT)
extern "C" void moe_emu_switch(void **save_sp, void *to_sp);
extern "C" void moe_emu_fiber_start();
asm(R"(
  .text
  .globl moe_emu_switch
  .type moe_emu_switch,@function
moe_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size moe_emu_switch,.-moe_emu_switch
  .globl moe_emu_fiber_start
  .type moe_emu_fiber_start,@function
moe_emu_fiber_start:
  movq %r12, %rdi
  call moe_emu_fiber_main
  ud2
  .size moe_emu_fiber_start,.-moe_emu_fiber_start
)");
#else
#include <ucontext.h>
#endif

// stackBytes is each fiber's stack; a guard page below it turns an
// overflow into a fault instead of silent corruption.
constexpr size_t stackBytes = 256 << 10;
constexpr size_t guardBytes = 4096;

struct fiber {
  unsigned char *stack; // lowest address of the usable stack
#if defined(__x86_64__) && !defined(MOE_EMU_UCONTEXT)
  void *sp;
#else
  ucontext_t uc;
#endif
};

// stacks are kept for reuse across launches (they cost an mmap each).
std::mutex stackMu;
std::vector<unsigned char *> stackPool;

unsigned char *getStack() {
  {
    std::lock_guard<std::mutex> l(stackMu);
    if (!stackPool.empty()) {
      unsigned char *s = stackPool.back();
      stackPool.pop_back();
      return s;
    }
  }
  void *m = mmap(nullptr, stackBytes + guardBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    return nullptr;
  }
  mprotect(m, guardBytes, PROT_NONE);
  return static_cast<unsigned char *>(m) + guardBytes;
}

void putStack(unsigned char *s) {
  std::lock_guard<std::mutex> l(stackMu);
  stackPool.push_back(s);
}

// launch is the state of the block that runs on this OS thread.
struct launch {
  moe_emu_call call;
  void **args;
  std::vector<fiber> fibers;
  std::vector<unsigned char> state; // per thread: 0 not started, 1 at a barrier, 2 done
  unsigned cur;
#if defined(__x86_64__) && !defined(MOE_EMU_UCONTEXT)
  void *schedSP;
#else
  ucontext_t sched;
#endif
};

thread_local launch *running;

void yieldToScheduler() {
  launch *l = running;
#if defined(__x86_64__) && !defined(MOE_EMU_UCONTEXT)
  moe_emu_switch(&l->fibers[l->cur].sp, l->schedSP);
#else
  swapcontext(&l->fibers[l->cur].uc, &l->sched);
#endif
}

} // namespace

extern "C" void moe_emu_fiber_main(void *arg) {
  launch *l = static_cast<launch *>(arg);
  l->call(l->args);
  l->state[l->cur] = 2;
  yieldToScheduler();
  abort(); // a finished fiber is never resumed
}

#if !defined(__x86_64__) || defined(MOE_EMU_UCONTEXT)
static void fiberEntry() { moe_emu_fiber_main(running); }
#endif

void __syncthreads() {
  running->state[running->cur] = 1;
  yieldToScheduler();
}

int moe_emu_register(const char *name, const char *sig, moe_emu_call call) {
  registry()[name] = kernel{sig, call};
  return 0;
}

// resume starts or continues thread i of the block until it yields.
static void resume(launch *l, unsigned i) {
  l->cur = i;
  unsigned bx = blockDim.x, by = blockDim.y;
  threadIdx = dim3{i % bx, (i / bx) % by, i / (bx * by)};
  fiber &f = l->fibers[i];
  if (l->state[i] == 0) {
#if defined(__x86_64__) && !defined(MOE_EMU_UCONTEXT)
    // The new stack holds moe_emu_switch's six saved registers (r12 is
    // the launch, for moe_emu_fiber_start) under the address to return
    // to; the top stays 16-byte aligned for the call that follows.
    void **top = reinterpret_cast<void **>(f.stack + stackBytes);
    void **sp = top - 7;
    sp[0] = nullptr;                                      // r15
    sp[1] = nullptr;                                      // r14
    sp[2] = nullptr;                                      // r13
    sp[3] = l;                                            // r12
    sp[4] = nullptr;                                      // rbx
    sp[5] = nullptr;                                      // rbp
    sp[6] = reinterpret_cast<void *>(moe_emu_fiber_start); // return address
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = stackBytes;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiberEntry, 0);
#endif
  }
#if defined(__x86_64__) && !defined(MOE_EMU_UCONTEXT)
  moe_emu_switch(&l->schedSP, f.sp);
#else
  swapcontext(&l->sched, &f.uc);
#endif
}

// shuffle sets order to a permutation of its indices that depends only
// on the block and the phase (the barriers passed), so runs repeat.
static void shuffle(std::vector<unsigned> &order, uint64_t block, uint64_t phase) {
  for (unsigned i = 0; i < order.size(); i++) {
    order[i] = i;
  }
  uint64_t r = (block + 1) * 0x9e3779b97f4a7c15ull ^ (phase + 1) * 0xbf58476d1ce4e5b9ull;
  for (size_t i = order.size(); i > 1; i--) {
    r ^= r << 13;
    r ^= r >> 7;
    r ^= r << 17;
    std::swap(order[i - 1], order[r % i]);
  }
}

static int fail(char *err, int errlen, const std::string &msg) {
  snprintf(err, errlen, "%s", msg.c_str());
  return -1;
}

int moe_emu_launch(const char *name, unsigned gx, unsigned gy, unsigned gz,
                   unsigned bx, unsigned by, unsigned bz, unsigned shared,
                   const char *sig, void **args, char *err, int errlen) {
  auto it = registry().find(name);
  if (it == registry().end()) {
    return fail(err, errlen, std::string("no kernel named ") + name);
  }
  const kernel &k = it->second;
  if (k.sig != sig) {
    return fail(err, errlen,
                std::string("kernel ") + name + " takes arguments \"" + k.sig +
                    "\", got \"" + sig + "\"");
  }
  // CUDA's limits, so that a launch the emulator accepts runs on a GPU.
  unsigned long long threads = 1ull * bx * by * bz;
  if (gx == 0 || gy == 0 || gz == 0 || threads == 0 || threads > 1024 ||
      bz > 64 || gy > 65535 || gz > 65535 || gx > 0x7fffffffu) {
    char b[160];
    snprintf(b, sizeof b, "kernel %s: launch grid (%u,%u,%u) block (%u,%u,%u) is outside CUDA's limits",
             name, gx, gy, gz, bx, by, bz);
    return fail(err, errlen, b);
  }
  if (shared > 48 << 10) {
    return fail(err, errlen, std::string("kernel ") + name + ": more than 48 KiB of dynamic shared memory");
  }
  std::vector<unsigned char> dyn(shared + 16, 0xff);
  moe_emu_dyn_shared = dyn.data();
  gridDim = dim3{gx, gy, gz};
  blockDim = dim3{bx, by, bz};

  launch l;
  l.call = k.call;
  l.args = args;
  l.fibers.resize(threads);
  l.state.resize(threads);
  launch *outer = running;
  running = &l;
  std::vector<unsigned char *> held; // stacks of this block's fibers
  std::vector<unsigned> order(threads);
  int rc = 0;
  // Blocks run one at a time, last first: a GPU runs them in no set
  // order, so a kernel that needs block 0's writes in block 1 is wrong.
  for (unsigned zz = gz; zz-- > 0 && rc == 0;) {
    for (unsigned yy = gy; yy-- > 0 && rc == 0;) {
      for (unsigned xx = gx; xx-- > 0 && rc == 0;) {
        unsigned x = xx, y = yy, z = zz;
        blockIdx = dim3{x, y, z};
        std::fill(l.state.begin(), l.state.end(), 0);
        unsigned left = threads;
        for (uint64_t phase = 0; left > 0 && rc == 0; phase++) {
          shuffle(order, (uint64_t(z) * gy + y) * gx + x, phase);
          for (unsigned i : order) {
            if (l.state[i] == 2) {
              continue;
            }
            if (l.state[i] == 0) {
              // A fiber that ends before the next starts hands its
              // stack on, so a kernel without barriers uses one.
              unsigned char *s = held.empty() ? getStack() : held.back();
              if (!held.empty()) {
                held.pop_back();
              }
              if (s == nullptr) {
                rc = fail(err, errlen, "no memory for a fiber stack");
                break;
              }
              l.fibers[i].stack = s;
            }
            resume(&l, i);
            if (l.state[i] == 2) {
              held.push_back(l.fibers[i].stack);
              left--;
            }
          }
        }
      }
    }
  }
  running = outer;
  moe_emu_dyn_shared = nullptr;
  for (unsigned char *s : held) {
    putStack(s);
  }
  return rc;
}

int moe_emu_kernels(char *buf, int len) {
  std::string all;
  for (auto &e : registry()) {
    all += e.first + "\n";
  }
  if (len > 0) {
    snprintf(buf, len, "%s", all.c_str());
  }
  return static_cast<int>(all.size()) + 1;
}

// Each allocation is followed by a guard of moeEmuGuard bytes of
// moeEmuCanary, which moe_emu_guard_ok checks after a launch: a kernel
// that writes past the end of a buffer it was given shows as an error.
static const int64_t moeEmuGuard = 256;
static const unsigned char moeEmuCanary = 0xcd;

uintptr_t moe_emu_alloc(int64_t bytes) {
  void *p = nullptr;
  if (posix_memalign(&p, 256, bytes + moeEmuGuard) != 0) {
    return 0;
  }
  // cuMemAlloc does not clear memory: fresh memory holds NaNs (0xff
  // bytes) here, so that a kernel or a copy that reads what nobody wrote
  // shows in the results.
  memset(p, 0xff, bytes);
  memset(static_cast<unsigned char *>(p) + bytes, moeEmuCanary, moeEmuGuard);
  return reinterpret_cast<uintptr_t>(p);
}

int moe_emu_guard_ok(uintptr_t p, int64_t bytes) {
  const unsigned char *g = reinterpret_cast<const unsigned char *>(p) + bytes;
  for (int64_t i = 0; i < moeEmuGuard; i++) {
    if (g[i] != moeEmuCanary) {
      return 0;
    }
  }
  return 1;
}

void moe_emu_free(uintptr_t p) { free(reinterpret_cast<void *>(p)); }

void moe_emu_copy(uintptr_t dst, uintptr_t src, int64_t bytes) {
  memmove(reinterpret_cast<void *>(dst), reinterpret_cast<void *>(src), bytes);
}

void moe_emu_memset32(uintptr_t dst, uint32_t v, int64_t n) {
  uint32_t *p = reinterpret_cast<uint32_t *>(dst);
  for (int64_t i = 0; i < n; i++) {
    p[i] = v;
  }
}

void moe_emu_sgemm(int ta, int tb, int m, int n, int k, float alpha,
                   uintptr_t a, int lda, int64_t sa, uintptr_t b, int ldb,
                   int64_t sb, float beta, uintptr_t c, int ldc, int64_t sc,
                   int batch) {
  for (int q = 0; q < batch; q++) {
    const float *A = reinterpret_cast<const float *>(a) + q * sa;
    const float *B = reinterpret_cast<const float *>(b) + q * sb;
    float *C = reinterpret_cast<float *>(c) + q * sc;
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < n; j++) {
        float s = 0;
        for (int p = 0; p < k; p++) {
          float av = ta ? A[(int64_t)p * lda + i] : A[(int64_t)i * lda + p];
          float bv = tb ? B[(int64_t)j * ldb + p] : B[(int64_t)p * ldb + j];
          s += av * bv;
        }
        float *cv = &C[(int64_t)i * ldc + j];
        *cv = beta == 0 ? alpha * s : alpha * s + beta * *cv;
      }
    }
  }
}

// The kernels, compiled as C++ with emu.h's built-ins, their registry,
// and the emulator's own test kernels.
#include "kernels/moehost.cu"
#include "emu_kernels.h"
#include "emu_testkernels.h"
