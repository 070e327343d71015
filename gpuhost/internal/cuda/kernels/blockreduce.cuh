// blockreduce.cuh holds the block-wide reductions and loops that the row
// kernels (rows.cu, attention.cu, index.cu) share. Every kernel that uses
// the reductions runs with blockDim.x a power of two of at most
// MOE_ROW_THREADS (the size of their shared arrays), and calls them from
// every thread of the block (they hold barriers).
#pragma once
#include "prelude.cuh"

#define MOE_ROW_THREADS 256

// moe_block_sum returns Σ v over the block to every thread; sh holds
// blockDim.x doubles.
__device__ double moe_block_sum(double v, double *sh) {
  unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      sh[t] += sh[t + s];
    }
    __syncthreads();
  }
  double r = sh[0];
  __syncthreads(); // sh is free again when every thread has read it
  return r;
}

// moe_block_max returns max v over the block to every thread; sh holds
// blockDim.x floats. NaNs lose, as in fmaxf.
__device__ float moe_block_max(float v, float *sh) {
  unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      sh[t] = fmaxf(sh[t], sh[t + s]);
    }
    __syncthreads();
  }
  float r = sh[0];
  __syncthreads();
  return r;
}

// moe_id_at returns element i of an int32 (is64 == 0) or int64 tensor.
__device__ long long moe_id_at(const void *p, long long i, int is64) {
  if (is64) {
    return ((const long long *)p)[i];
  }
  return (long long)((const int *)p)[i];
}

// moe_block_min_ll returns min v over the block to every thread; sh holds
// blockDim.x long longs.
__device__ long long moe_block_min_ll(long long v, long long *sh) {
  unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s && sh[t + s] < sh[t]) {
      sh[t] = sh[t + s];
    }
    __syncthreads();
  }
  long long r = sh[0];
  __syncthreads();
  return r;
}

// moe_block_sum_ll returns Σ v over the block to every thread; sh holds
// blockDim.x long longs.
__device__ long long moe_block_sum_ll(long long v, long long *sh) {
  unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      sh[t] += sh[t + s];
    }
    __syncthreads();
  }
  long long r = sh[0];
  __syncthreads();
  return r;
}

// MOE_FOR_ROW walks this thread's elements j of a row of n.
#define MOE_FOR_ROW(j, n)                                                      \
  for (long long j = threadIdx.x; j < (n); j += blockDim.x)

// MOE_FOR_GRID walks this thread's elements i of n in a grid-stride loop
// over a 1-D grid.
#define MOE_FOR_GRID(i, n)                                                     \
  for (long long i = moe_grid_start(); i < (n); i += moe_grid_stride())
