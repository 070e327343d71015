// prelude.cuh holds what every kernel file needs. Under nvcc it is empty
// but for includes; the emulator (cudaemu) defines MOEHOST_CUDA_EMU and
// supplies its own definitions of the CUDA built-ins before this file
// (gpuhost/internal/cuda/emu.h).
//
// One convention keeps one source for both: dynamic shared memory is
// declared with MOE_EXTERN_SHARED(T, name) instead of
// extern __shared__ T name[]. The emulator finds the kernels itself
// (every extern "C" __global__ function; see emu_kernels.h).
#pragma once
#ifndef MOEHOST_CUDA_EMU
#include <cuda_runtime.h>
#define MOE_EXTERN_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

// moe_block_row is the row of a block launched by the device's launchRowsOf:
// its grid has at most 65535 blocks in x and the rest in y, so the last
// blocks may be past the last row and must return.
__device__ inline long long moe_block_row() {
  return (long long)blockIdx.y * gridDim.x + blockIdx.x;
}

// moe_grid_start and moe_grid_stride walk a grid-stride loop of the
// device's launch1D: for (i = moe_grid_start(); i < n; i += moe_grid_stride()).
__device__ inline long long moe_grid_start() {
  return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ inline long long moe_grid_stride() {
  return (long long)gridDim.x * blockDim.x;
}
