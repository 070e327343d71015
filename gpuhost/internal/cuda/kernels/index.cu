// index.cu holds the kernels that index with int32 or int64 ids (is64
// says which): the ids check, embedding and cross-entropy, forward and
// backward.
#include "blockreduce.cuh"

// moe_ids_check_partial is the first pass of the ids check over ids[n]:
// block b writes part[2b] = the lowest index i it saw whose id is outside
// [0, v) (n if none), and part[2b+1] = how many ids it saw are in range.
// With use_ignore, an id equal to ignore is neither (cross-entropy's
// ignore_index). Grid-stride over a 1-D grid.
extern "C" __global__ void moe_ids_check_partial(long long *part,
                                                 const void *ids, int is64,
                                                 long long n, long long v,
                                                 int use_ignore,
                                                 long long ignore) {
  __shared__ long long sh[MOE_ROW_THREADS];
  long long bad = n, count = 0;
  MOE_FOR_GRID(i, n) {
    long long id = moe_id_at(ids, i, is64);
    if (use_ignore && id == ignore) {
      continue;
    }
    if (id < 0 || id >= v) {
      if (i < bad) {
        bad = i;
      }
    } else {
      count++;
    }
  }
  bad = moe_block_min_ll(bad, sh);
  count = moe_block_sum_ll(count, sh);
  if (threadIdx.x == 0) {
    part[2 * (long long)blockIdx.x] = bad;
    part[2 * (long long)blockIdx.x + 1] = count;
  }
}

// moe_ids_check_finish is the second pass, one block: it folds the
// blocks pairs of part into out[0] (the lowest bad index) and out[1] (the
// count).
extern "C" __global__ void moe_ids_check_finish(long long *out,
                                                const long long *part,
                                                long long blocks, long long n) {
  __shared__ long long sh[MOE_ROW_THREADS];
  long long bad = n, count = 0;
  MOE_FOR_ROW(b, blocks) {
    if (part[2 * b] < bad) {
      bad = part[2 * b];
    }
    count += part[2 * b + 1];
  }
  bad = moe_block_min_ll(bad, sh);
  count = moe_block_sum_ll(count, sh);
  if (threadIdx.x == 0) {
    out[0] = bad;
    out[1] = count;
  }
}

// moe_embedding_fwd sets y[i·d + j] = table[ids[i]·d + j] for n ids; the
// ids are valid.
extern "C" __global__ void moe_embedding_fwd(float *y, const void *ids,
                                             int is64, const float *table,
                                             long long n, long long d) {
  MOE_FOR_GRID(i, n * d) {
    long long id = moe_id_at(ids, i / d, is64);
    y[i] = table[id * d + i % d];
  }
}

// moe_embedding_bwd adds gy[i·d + j] into gtable[ids[i]·d + j]; rows that
// share an id add atomically.
extern "C" __global__ void moe_embedding_bwd(float *gtable, const void *ids,
                                             int is64, const float *gy,
                                             long long n, long long d) {
  MOE_FOR_GRID(i, n * d) {
    long long id = moe_id_at(ids, i / d, is64);
    atomicAdd(&gtable[id * d + i % d], gy[i]);
  }
}

// moe_cross_entropy_fwd sets, per row r of the [n, c] logits x,
// lse[r] = logsumexp(x[r]) and loss[r] = lse[r] − x[r, t_r], or 0 when
// t_r is ignore. The targets are valid.
extern "C" __global__ void moe_cross_entropy_fwd(float *loss, float *lse,
                                                 const float *x,
                                                 const void *targets, int is64,
                                                 long long n, long long c,
                                                 long long ignore) {
  __shared__ double sh[MOE_ROW_THREADS];
  __shared__ float shf[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= n) {
    return;
  }
  const float *xr = x + r * c;
  float m = -INFINITY;
  MOE_FOR_ROW(j, c) { m = fmaxf(m, xr[j]); }
  m = moe_block_max(m, shf);
  double s = 0;
  MOE_FOR_ROW(j, c) { s += expf(xr[j] - m); }
  s = moe_block_sum(s, sh);
  if (threadIdx.x == 0) {
    double e = (double)m + log(s);
    lse[r] = (float)e;
    long long t = moe_id_at(targets, r, is64);
    loss[r] = t == ignore ? 0.0f : (float)(e - (double)xr[t]);
  }
}

// moe_cross_entropy_bwd sets gx[r, j] = gy[r]·(softmax(x[r])_j − [j = t_r])
// over the n·c elements, and zeros on rows whose target is ignore.
extern "C" __global__ void moe_cross_entropy_bwd(float *gx, const float *x,
                                                 const float *lse,
                                                 const void *targets, int is64,
                                                 const float *gy, long long n,
                                                 long long c,
                                                 long long ignore) {
  MOE_FOR_GRID(i, n * c) {
    long long r = i / c, j = i % c;
    long long t = moe_id_at(targets, r, is64);
    if (t == ignore) {
      gx[i] = 0;
      continue;
    }
    float g = gy[r];
    float v = (float)((double)g * (double)expf(x[i] - lse[r]));
    if (j == t) {
      v -= g;
    }
    gx[i] = v;
  }
}
