// blockreduce.cuh holds the block-wide reductions and loops that the row
// kernels (rows.cu, attention.cu, index.cu) share. Every kernel that uses
// the reductions runs with blockDim.x a power of two of at most
// MOE_ROW_THREADS (the size of their shared arrays), and calls them from
// every thread of the block (they hold barriers).
#pragma once
#include "prelude.cuh"

#define MOE_ROW_THREADS 256

// moe_block_reduce returns op folded over every thread's v, to every
// thread of the block; sh holds blockDim.x values of T. op must be
// associative and commutative: the tree pairs threads t and t + s.
template <typename T, typename Op>
__device__ T moe_block_reduce(T v, T *sh, Op op) {
  unsigned t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      sh[t] = op(sh[t], sh[t + s]);
    }
    __syncthreads();
  }
  T r = sh[0];
  __syncthreads(); // sh is free again when every thread has read it
  return r;
}

struct moe_op_add {
  template <typename T> __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// moe_op_max is fmaxf: NaNs lose.
struct moe_op_max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct moe_op_min {
  template <typename T> __device__ T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};

// moe_block_sum returns Σ v over the block to every thread; sh holds
// blockDim.x doubles.
__device__ double moe_block_sum(double v, double *sh) {
  return moe_block_reduce(v, sh, moe_op_add());
}

// moe_block_max returns max v over the block to every thread; sh holds
// blockDim.x floats. NaNs lose, as in fmaxf.
__device__ float moe_block_max(float v, float *sh) {
  return moe_block_reduce(v, sh, moe_op_max());
}

// moe_block_min_ll returns min v over the block to every thread; sh holds
// blockDim.x long longs.
__device__ long long moe_block_min_ll(long long v, long long *sh) {
  return moe_block_reduce(v, sh, moe_op_min());
}

// moe_block_sum_ll returns Σ v over the block to every thread; sh holds
// blockDim.x long longs.
__device__ long long moe_block_sum_ll(long long v, long long *sh) {
  return moe_block_reduce(v, sh, moe_op_add());
}

// moe_id_at returns element i of an int32 (is64 == 0) or int64 tensor.
__device__ long long moe_id_at(const void *p, long long i, int is64) {
  if (is64) {
    return ((const long long *)p)[i];
  }
  return (long long)((const int *)p)[i];
}

// MOE_FOR_ROW walks this thread's elements j of a row of n.
#define MOE_FOR_ROW(j, n)                                                      \
  for (long long j = threadIdx.x; j < (n); j += blockDim.x)

// MOE_FOR_GRID walks this thread's elements i of n in a grid-stride loop
// over a 1-D grid.
#define MOE_FOR_GRID(i, n)                                                     \
  for (long long i = moe_grid_start(); i < (n); i += moe_grid_stride())
