// moehost.cu is the one translation unit of the CUDA device's kernels:
// `make generate-cuda` compiles it to moehost.ptx, which the cuda package
// embeds and loads at run time, and the emulator (build tag cudaemu)
// compiles it as C++ to run the same kernels on the CPU. Kernels live in
// the files included below; each is extern "C" so that its PTX name is
// its source name.

#include "prelude.cuh"

// moe_fill_f32 sets p[i] = v for i in [0, n).
extern "C" __global__ void moe_fill_f32(float *p, float v, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    p[i] = v;
  }
}

#include "elementwise.cu"
#include "optim.cu"
#include "rows.cu"
#include "attention.cu"
#include "index.cu"
