// rows.cu holds the row kernels of gpuhost's CUDA device: layer and RMS
// norm, softmax and log-softmax, reductions along an axis, permute and
// copy2D. A row kernel runs one block per row (moe_block_row) of a power
// of two threads up to MOE_ROW_THREADS, each thread striding over the row,
// and reduces with the block reductions of blockreduce.cuh; row
// statistics accumulate in double, as the CPU device's do. Elementwise
// kernels are grid-stride loops over a 1-D grid. Sizes and offsets are
// long long, but for the _u32 kernels' 32-bit indices.
#include "blockreduce.cuh"

// moe_layernorm_fwd normalises each of rows rows of h elements of x into
// y = (x − mean)·rstd·w + b and keeps the row's mean and rstd. Two
// passes, so that a large mean does not eat the variance.
extern "C" __global__ void moe_layernorm_fwd(float *y, float *mean, float *rstd,
                                             const float *x, const float *w,
                                             const float *b, long long rows,
                                             long long h, double eps) {
  __shared__ double sh[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= rows) {
    return;
  }
  const float *xr = x + r * h;
  float *yr = y + r * h;
  double s = 0;
  MOE_FOR_ROW(i, h) { s += xr[i]; }
  double m = moe_block_sum(s, sh) / (double)h;
  double q = 0;
  MOE_FOR_ROW(i, h) {
    double d = (double)xr[i] - m;
    q += d * d;
  }
  double inv = 1.0 / sqrt(moe_block_sum(q, sh) / (double)h + eps);
  if (threadIdx.x == 0) {
    mean[r] = (float)m;
    rstd[r] = (float)inv;
  }
  MOE_FOR_ROW(i, h) { yr[i] = (float)(((double)xr[i] - m) * inv) * w[i] + b[i]; }
}

// moe_layernorm_bwd_x sets gx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)) per row,
// with ĝ = gy·w and x̂ = (x − mean)·rstd.
extern "C" __global__ void moe_layernorm_bwd_x(float *gx, const float *x,
                                               const float *w,
                                               const float *mean,
                                               const float *rstd,
                                               const float *gy, long long rows,
                                               long long h) {
  __shared__ double sh[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= rows) {
    return;
  }
  const float *xr = x + r * h, *gr = gy + r * h;
  float *or_ = gx + r * h;
  double m = mean[r], inv = rstd[r];
  double sg = 0, sgx = 0;
  MOE_FOR_ROW(i, h) {
    double gh = (double)gr[i] * (double)w[i];
    sg += gh;
    sgx += gh * ((double)xr[i] - m) * inv;
  }
  sg = moe_block_sum(sg, sh) / (double)h;
  sgx = moe_block_sum(sgx, sh) / (double)h;
  MOE_FOR_ROW(i, h) {
    double xh = ((double)xr[i] - m) * inv;
    double gh = (double)gr[i] * (double)w[i];
    or_[i] = (float)(inv * (gh - sg - xh * sgx));
  }
}

// moe_rmsnorm_fwd sets y = x·rstd·w per row of h, rstd = 1/√(mean(x²)+eps).
extern "C" __global__ void moe_rmsnorm_fwd(float *y, float *rstd,
                                           const float *x, const float *w,
                                           long long rows, long long h,
                                           double eps) {
  __shared__ double sh[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= rows) {
    return;
  }
  const float *xr = x + r * h;
  float *yr = y + r * h;
  double q = 0;
  MOE_FOR_ROW(i, h) { q += (double)xr[i] * (double)xr[i]; }
  double inv = 1.0 / sqrt(moe_block_sum(q, sh) / (double)h + eps);
  if (threadIdx.x == 0) {
    rstd[r] = (float)inv;
  }
  MOE_FOR_ROW(i, h) { yr[i] = (float)((double)xr[i] * inv) * w[i]; }
}

// moe_rmsnorm_bwd_x sets gx = r·gy·w − r³/h·x·Σ gy·w·x per row.
extern "C" __global__ void moe_rmsnorm_bwd_x(float *gx, const float *x,
                                             const float *w, const float *rstd,
                                             const float *gy, long long rows,
                                             long long h) {
  __shared__ double sh[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= rows) {
    return;
  }
  const float *xr = x + r * h, *gr = gy + r * h;
  float *or_ = gx + r * h;
  double inv = rstd[r];
  double s = 0;
  MOE_FOR_ROW(i, h) { s += (double)gr[i] * (double)w[i] * (double)xr[i]; }
  double c = inv * inv * inv * moe_block_sum(s, sh) / (double)h;
  MOE_FOR_ROW(i, h) {
    or_[i] = (float)(inv * (double)gr[i] * (double)w[i] - c * (double)xr[i]);
  }
}

// moe_norm_wb_partial sums the weight (and bias) gradients of a norm over
// one chunk of rows: chunk blockIdx.y covers rows [y·rpc, (y+1)·rpc), and
// block x covers 32 columns, each with 8 lanes of rows. It writes
// pw[chunk·h + col] = Σ gy·x̂ and pb[chunk·h + col] = Σ gy, where
// x̂ = (x − mean)·rstd for layer norm and x·rstd when mean is null
// (RMS norm). pb may be null.
extern "C" __global__ void moe_norm_wb_partial(float *pw, float *pb,
                                               const float *x,
                                               const float *mean,
                                               const float *rstd,
                                               const float *gy, long long rows,
                                               long long h, long long rpc) {
  __shared__ double shw[MOE_ROW_THREADS];
  __shared__ double shb[MOE_ROW_THREADS];
  unsigned lane = threadIdx.x >> 5;
  long long col = (long long)blockIdx.x * 32 + (threadIdx.x & 31);
  long long lo = (long long)blockIdx.y * rpc;
  long long hi = lo + rpc < rows ? lo + rpc : rows;
  double sw = 0, sb = 0;
  if (col < h) {
    for (long long r = lo + lane; r < hi; r += blockDim.x >> 5) {
      double g = gy[r * h + col];
      double xv = x[r * h + col];
      double xh = mean ? (xv - (double)mean[r]) * (double)rstd[r]
                       : xv * (double)rstd[r];
      sw += g * xh;
      sb += g;
    }
  }
  shw[threadIdx.x] = sw;
  shb[threadIdx.x] = sb;
  __syncthreads();
  if (lane == 0 && col < h) {
    for (unsigned l = 1; l < (blockDim.x >> 5); l++) {
      sw += shw[threadIdx.x + 32 * l];
      sb += shb[threadIdx.x + 32 * l];
    }
    long long o = (long long)blockIdx.y * h + col;
    if (pw) {
      pw[o] = (float)sw;
    }
    if (pb) {
      pb[o] = (float)sb;
    }
  }
}

// moe_colsum sets out[j] = Σ_c part[c·h + j] for c in [0, chunks), in
// double: the second pass of moe_norm_wb_partial.
extern "C" __global__ void moe_colsum(float *out, const float *part,
                                      long long chunks, long long h) {
  MOE_FOR_GRID(j, h) {
    double s = 0;
    for (long long c = 0; c < chunks; c++) {
      s += part[c * h + j];
    }
    out[j] = (float)s;
  }
}

// moe_softmax_fwd sets y to the softmax (or log-softmax when logsm) of x
// along dim of an [outer, dim, inner] view: row r = (o, k) holds the
// elements o·dim·inner + j·inner + k.
extern "C" __global__ void moe_softmax_fwd(float *y, const float *x,
                                           long long outer, long long dim,
                                           long long inner, int logsm) {
  __shared__ double sh[MOE_ROW_THREADS];
  __shared__ float shf[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= outer * inner) {
    return;
  }
  long long base = (r / inner) * dim * inner + r % inner;
  float m = -INFINITY;
  MOE_FOR_ROW(j, dim) { m = fmaxf(m, x[base + j * inner]); }
  m = moe_block_max(m, shf);
  double s = 0;
  MOE_FOR_ROW(j, dim) { s += expf(x[base + j * inner] - m); }
  s = moe_block_sum(s, sh);
  if (logsm) {
    double ls = (double)m + log(s);
    MOE_FOR_ROW(j, dim) {
      long long i = base + j * inner;
      y[i] = (float)((double)x[i] - ls);
    }
    return;
  }
  double inv = 1.0 / s;
  MOE_FOR_ROW(j, dim) {
    long long i = base + j * inner;
    y[i] = (float)((double)expf(x[i] - m) * inv);
  }
}

// moe_softmax_bwd sets gx from the forward's y and gy on the same view:
// softmax gives gx = y·(gy − Σ gy·y), log-softmax gx = gy − e^y·Σ gy.
extern "C" __global__ void moe_softmax_bwd(float *gx, const float *y,
                                           const float *gy, long long outer,
                                           long long dim, long long inner,
                                           int logsm) {
  __shared__ double sh[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= outer * inner) {
    return;
  }
  long long base = (r / inner) * dim * inner + r % inner;
  double s = 0;
  MOE_FOR_ROW(j, dim) {
    long long i = base + j * inner;
    s += logsm ? (double)gy[i] : (double)gy[i] * (double)y[i];
  }
  s = moe_block_sum(s, sh);
  MOE_FOR_ROW(j, dim) {
    long long i = base + j * inner;
    gx[i] = logsm ? (float)((double)gy[i] - (double)expf(y[i]) * s)
                  : (float)((double)y[i] * ((double)gy[i] - s));
  }
}

// moe_max_better reports whether candidate (bv, bi) beats (av, ai) in an
// arg-max: a NaN beats a number, a larger value beats a smaller, and of
// equals the lower index wins, so the result is the first maximum (or the
// first NaN). An index below 0 is no candidate.
__device__ int moe_max_better(float bv, long long bi, float av, long long ai) {
  if (bi < 0) {
    return 0;
  }
  if (ai < 0) {
    return 1;
  }
  int bn = bv != bv, an = av != av;
  if (bn != an) {
    return bn;
  }
  if (bn || bv == av) {
    return bi < ai;
  }
  return bv > av;
}

// moe_reduce_axis reduces dim of an [outer, dim, inner] view of src into
// dst[outer·inner]: fn 0 sums, 1 averages, 2 takes the maximum and writes
// the first index of it (int32) to arg.
extern "C" __global__ void moe_reduce_axis(float *dst, int *arg,
                                           const float *src, long long outer,
                                           long long dim, long long inner,
                                           int fn) {
  __shared__ double sh[MOE_ROW_THREADS];
  __shared__ float shv[MOE_ROW_THREADS];
  __shared__ long long shi[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= outer * inner) {
    return;
  }
  long long base = (r / inner) * dim * inner + r % inner;
  if (fn != 2) {
    double s = 0;
    MOE_FOR_ROW(j, dim) { s += src[base + j * inner]; }
    s = moe_block_sum(s, sh);
    if (threadIdx.x == 0) {
      dst[r] = (float)(fn == 1 ? s / (double)dim : s);
    }
    return;
  }
  float best = 0;
  long long at = -1;
  MOE_FOR_ROW(j, dim) {
    float v = src[base + j * inner];
    if (moe_max_better(v, j, best, at)) {
      best = v;
      at = j;
    }
  }
  unsigned t = threadIdx.x;
  shv[t] = best;
  shi[t] = at;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s && moe_max_better(shv[t + s], shi[t + s], shv[t], shi[t])) {
      shv[t] = shv[t + s];
      shi[t] = shi[t + s];
    }
    __syncthreads();
  }
  if (t == 0) {
    dst[r] = shv[0];
    arg[r] = (int)shi[0];
  }
}

// The _cols kernels below are the row kernels above for views with inner
// >= 32: a thread per row, over a 1-D grid, walks its row alone, so the
// threads of a warp (rows k, k+1, … of one outer index) read neighbouring
// addresses at every step, where a block per row would read one element
// per 32-byte sector.

// moe_softmax_fwd_cols is moe_softmax_fwd with a thread per row.
extern "C" __global__ void moe_softmax_fwd_cols(float *y, const float *x,
                                                long long outer, long long dim,
                                                long long inner, int logsm) {
  MOE_FOR_GRID(r, outer * inner) {
    long long base = (r / inner) * dim * inner + r % inner;
    float m = -INFINITY;
    for (long long j = 0; j < dim; j++) {
      m = fmaxf(m, x[base + j * inner]);
    }
    double s = 0;
    for (long long j = 0; j < dim; j++) {
      s += expf(x[base + j * inner] - m);
    }
    double ls = (double)m + log(s), inv = 1.0 / s;
    for (long long j = 0; j < dim; j++) {
      long long i = base + j * inner;
      y[i] = logsm ? (float)((double)x[i] - ls)
                   : (float)((double)expf(x[i] - m) * inv);
    }
  }
}

// moe_softmax_bwd_cols is moe_softmax_bwd with a thread per row.
extern "C" __global__ void moe_softmax_bwd_cols(float *gx, const float *y,
                                                const float *gy,
                                                long long outer, long long dim,
                                                long long inner, int logsm) {
  MOE_FOR_GRID(r, outer * inner) {
    long long base = (r / inner) * dim * inner + r % inner;
    double s = 0;
    for (long long j = 0; j < dim; j++) {
      long long i = base + j * inner;
      s += logsm ? (double)gy[i] : (double)gy[i] * (double)y[i];
    }
    for (long long j = 0; j < dim; j++) {
      long long i = base + j * inner;
      gx[i] = logsm ? (float)((double)gy[i] - (double)expf(y[i]) * s)
                    : (float)((double)y[i] * ((double)gy[i] - s));
    }
  }
}

// moe_reduce_axis_cols is moe_reduce_axis with a thread per row.
extern "C" __global__ void moe_reduce_axis_cols(float *dst, int *arg,
                                                const float *src,
                                                long long outer, long long dim,
                                                long long inner, int fn) {
  MOE_FOR_GRID(r, outer * inner) {
    long long base = (r / inner) * dim * inner + r % inner;
    if (fn != 2) {
      double s = 0;
      for (long long j = 0; j < dim; j++) {
        s += src[base + j * inner];
      }
      dst[r] = (float)(fn == 1 ? s / (double)dim : s);
      continue;
    }
    float best = 0;
    long long at = -1;
    for (long long j = 0; j < dim; j++) {
      float v = src[base + j * inner];
      if (moe_max_better(v, j, best, at)) {
        best = v;
        at = j;
      }
    }
    dst[r] = best;
    arg[r] = (int)at;
  }
}

// moe_reduce_axis_bwd sets gx, an [outer, dim, inner] tensor of n
// elements, from gy[outer·inner]: sum spreads gy, mean gy/dim, and max
// puts gy at the arg-max and zeros elsewhere.
extern "C" __global__ void moe_reduce_axis_bwd(float *gx, const float *gy,
                                               const int *arg, long long n,
                                               long long dim, long long inner,
                                               int fn) {
  MOE_FOR_GRID(i, n) {
    long long j = (i / inner) % dim;
    long long r = (i / (dim * inner)) * inner + i % inner;
    float g = gy[r];
    if (fn == 1) {
      g = (float)((double)g / (double)dim);
    } else if (fn == 2 && arg[r] != j) {
      g = 0;
    }
    gx[i] = g;
  }
}

// moe_permute_body sets dst (n elements, of rank dims d) from src: dst's
// element at multi-index (i0, …) reads src at Σ ik·st[k], where st[k] is
// the src stride of dst's dim k. I is the index type: unsigned int where
// every index fits, since 64-bit division costs a GPU several times the
// memory traffic of a copy.
template <typename I>
__device__ void moe_permute_body(float *dst, const float *src, I n, int rank,
                                 const I *d, const I *st) {
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (I)gridDim.x * blockDim.x) {
    I rem = i, off = 0;
    for (int k = rank - 1; k >= 0; k--) {
      off += (rem % d[k]) * st[k];
      rem /= d[k];
    }
    dst[i] = src[off];
  }
}

// moe_permute runs moe_permute_body with 64-bit indices; d0..d7 are the
// dims (the first rank count) and s0..s7 their src strides.
extern "C" __global__ void moe_permute(
    float *dst, const float *src, long long n, int rank, long long d0,
    long long d1, long long d2, long long d3, long long d4, long long d5,
    long long d6, long long d7, long long s0, long long s1, long long s2,
    long long s3, long long s4, long long s5, long long s6, long long s7) {
  long long d[8] = {d0, d1, d2, d3, d4, d5, d6, d7};
  long long st[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
  moe_permute_body<long long>(dst, src, n, rank, d, st);
}

// moe_permute_u32 is moe_permute for tensors below 2³¹ elements, with
// 32-bit indices.
extern "C" __global__ void moe_permute_u32(
    float *dst, const float *src, long long n, int rank, long long d0,
    long long d1, long long d2, long long d3, long long d4, long long d5,
    long long d6, long long d7, long long s0, long long s1, long long s2,
    long long s3, long long s4, long long s5, long long s6, long long s7) {
  unsigned d[8] = {(unsigned)d0, (unsigned)d1, (unsigned)d2, (unsigned)d3,
                   (unsigned)d4, (unsigned)d5, (unsigned)d6, (unsigned)d7};
  unsigned st[8] = {(unsigned)s0, (unsigned)s1, (unsigned)s2, (unsigned)s3,
                    (unsigned)s4, (unsigned)s5, (unsigned)s6, (unsigned)s7};
  moe_permute_body<unsigned>(dst, src, (unsigned)n, rank, d, st);
}

// moe_copy2d_body copies rows×width elements: dst[dOff + r·dStride + j] =
// src[sOff + r·sStride + j], with indices of type I.
template <typename I>
__device__ void moe_copy2d_body(float *dst, I dOff, I dStride, const float *src,
                                I sOff, I sStride, I rows, I width) {
  I n = rows * width;
  for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (I)gridDim.x * blockDim.x) {
    I r = i / width, j = i % width;
    dst[dOff + r * dStride + j] = src[sOff + r * sStride + j];
  }
}

// moe_copy2d runs moe_copy2d_body with 64-bit indices.
extern "C" __global__ void moe_copy2d(float *dst, long long dOff,
                                      long long dStride, const float *src,
                                      long long sOff, long long sStride,
                                      long long rows, long long width) {
  moe_copy2d_body<long long>(dst, dOff, dStride, src, sOff, sStride, rows,
                             width);
}

// moe_copy2d_u32 is moe_copy2d for tensors below 2³¹ elements, with
// 32-bit indices.
extern "C" __global__ void moe_copy2d_u32(float *dst, long long dOff,
                                          long long dStride, const float *src,
                                          long long sOff, long long sStride,
                                          long long rows, long long width) {
  moe_copy2d_body<unsigned>(dst, (unsigned)dOff, (unsigned)dStride, src,
                            (unsigned)sOff, (unsigned)sStride, (unsigned)rows,
                            (unsigned)width);
}
