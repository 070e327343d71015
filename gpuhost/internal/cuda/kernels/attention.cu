// attention.cu holds the row kernels of scaled-dot-product attention; the
// device composes them with the driver's batched GEMMs: S = q·kᵀ into the
// probabilities' storage, moe_attn_softmax in place, out = P·v; and back,
// dP = gout·vᵀ, moe_attn_softmax_bwd in place, then the GEMMs of gq, gk.
#include "blockreduce.cuh"

// moe_attn_softmax turns each row of s, the [B·H·tq, tk] scores q·kᵀ, into
// the probabilities softmax(scale·s) over the visible keys, and 0 for the
// others: with causal, row i (of tq) sees keys j < i + tk − tq + 1; with a
// mask ([B, tk] bool, may be null), keys whose mask byte is set are
// hidden. A row with no visible key is all zeros.
extern "C" __global__ void moe_attn_softmax(float *s, const unsigned char *mask,
                                            long long rows, long long h,
                                            long long tq, long long tk,
                                            int causal, float scale) {
  __shared__ double sh[MOE_ROW_THREADS];
  __shared__ float shf[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= rows) {
    return;
  }
  float *row = s + r * tk;
  long long i = r % tq;
  const unsigned char *mrow = mask ? mask + (r / (tq * h)) * tk : 0;
  long long lim = tk;
  if (causal) {
    lim = i + tk - tq + 1;
    lim = lim < 0 ? 0 : (lim > tk ? tk : lim);
  }
  float m = -INFINITY;
  MOE_FOR_ROW(j, tk) {
    if (j < lim && !(mrow && mrow[j])) {
      m = fmaxf(m, row[j] * scale);
    }
  }
  m = moe_block_max(m, shf);
  if (m == -INFINITY) { // every key hidden
    MOE_FOR_ROW(j, tk) { row[j] = 0; }
    return;
  }
  double sum = 0;
  MOE_FOR_ROW(j, tk) {
    if (j < lim && !(mrow && mrow[j])) {
      sum += expf(row[j] * scale - m);
    }
  }
  double inv = 1.0 / moe_block_sum(sum, sh);
  MOE_FOR_ROW(j, tk) {
    bool vis = j < lim && !(mrow && mrow[j]);
    row[j] = vis ? (float)((double)expf(row[j] * scale - m) * inv) : 0.0f;
  }
}

// moe_attn_softmax_bwd turns each row of ds, which holds dP = gout·vᵀ, into
// dS = P·(dP − Σ dP·P)·scale, with p the forward's probabilities.
extern "C" __global__ void moe_attn_softmax_bwd(float *ds, const float *p,
                                                long long rows, long long tk,
                                                double scale) {
  __shared__ double sh[MOE_ROW_THREADS];
  long long r = moe_block_row();
  if (r >= rows) {
    return;
  }
  float *dr = ds + r * tk;
  const float *pr = p + r * tk;
  double s = 0;
  MOE_FOR_ROW(j, tk) { s += (double)pr[j] * (double)dr[j]; }
  s = moe_block_sum(s, sh);
  MOE_FOR_ROW(j, tk) {
    dr[j] = (float)((double)pr[j] * ((double)dr[j] - s) * scale);
  }
}
