// elementwise.cu holds the CUDA device's elementwise kernels and its
// float64 sum of squares. Each walks a grid-stride loop (launch1D), so any
// grid covers any length. They follow the CPU device's arithmetic
// (gpuhost/cpu_kernels.go, cpu_ops.go): float32 for the cheap functions,
// float64 for the transcendental ones of unary and their derivatives.

#include "blockreduce.cuh"

// moe_add_repeat_f32 sets dst[i] = src[i] + small[i mod ns]. dst may be src.
extern "C" __global__ void moe_add_repeat_f32(float *dst, const float *src, const float *small,
                                              long long n, long long ns) {
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    dst[i] = src[i] + small[i % ns];
  }
}

// moe_sum_rows_f32 sets dst[j] = Σ_r src[r·n + j]. A block of 32×8
// threads takes 32 columns: each of its 8 lanes sums every 8th row (a warp
// reads 32 neighbouring floats), and the lanes' sums are added in shared
// memory, in lane order, so the result does not depend on scheduling.
// grid.x = ⌈n/32⌉.
extern "C" __global__ void moe_sum_rows_f32(float *dst, const float *src, long long rows, long long n) {
  __shared__ float part[8][33];
  unsigned tx = threadIdx.x, ty = threadIdx.y;
  long long j = (long long)blockIdx.x * 32 + tx;
  float s = 0;
  if (j < n) {
    for (long long r = ty; r < rows; r += 8) {
      s += src[r * n + j];
    }
  }
  part[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && j < n) {
    float t = 0;
    for (int l = 0; l < 8; l++) {
      t += part[l][tx];
    }
    dst[j] = t;
  }
}

// The tanh form of GELU, as the CPU device's geluForward32: √(2/π) and the
// cubic coefficient.
#define MOE_GELU_C 0.7978845608028654f
#define MOE_GELU_A 0.044715f

// moe_gelu_f32 sets y = gelu_tanh(x).
extern "C" __global__ void moe_gelu_f32(float *y, const float *x, long long n) {
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    float v = x[i];
    float t = tanhf(MOE_GELU_C * (v + MOE_GELU_A * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

// moe_gelu_backward_f32 sets gx = gy·gelu_tanh'(x):
// ½(1+t) + ½x(1−t²)·c(1+3a·x²), t = tanh(c(x+a·x³)).
extern "C" __global__ void moe_gelu_backward_f32(float *gx, const float *x, const float *gy, long long n) {
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    float v = x[i];
    float v2 = v * v;
    float t = tanhf(MOE_GELU_C * (v + MOE_GELU_A * v2 * v));
    float dy = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * MOE_GELU_C * (1.0f + 3.0f * MOE_GELU_A * v2);
    gx[i] = gy[i] * dy;
  }
}

// Unary functions: gpuhost's unaryFn values, in order.
#define MOE_UNARY_SCALE 0
#define MOE_UNARY_ADD_SCALAR 1
#define MOE_UNARY_RELU 2
#define MOE_UNARY_GELU 3
#define MOE_UNARY_TANH 4
#define MOE_UNARY_SIGMOID 5
#define MOE_UNARY_SILU 6
#define MOE_UNARY_EXP 7
#define MOE_UNARY_LOG 8
#define MOE_UNARY_SQRT 9
#define MOE_UNARY_NEG 10

__device__ inline double moe_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

// moe_unary_f32 sets y = fn(x); p is scale's factor and add_scalar's
// addend. y may be x.
extern "C" __global__ void moe_unary_f32(int fn, double p, float *y, const float *x, long long n) {
  float pf = (float)p;
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    float v = x[i];
    double d = v;
    float r;
    switch (fn) {
    case MOE_UNARY_SCALE: r = pf * v; break;
    case MOE_UNARY_ADD_SCALAR: r = v + pf; break;
    case MOE_UNARY_RELU: r = fmaxf(v, 0.0f); break;
    case MOE_UNARY_NEG: r = -v; break;
    case MOE_UNARY_GELU: r = (float)(0.5 * d * (1.0 + erf(d * 0.7071067811865476))); break;
    case MOE_UNARY_TANH: r = (float)tanh(d); break;
    case MOE_UNARY_SIGMOID: r = (float)moe_sigmoid(d); break;
    case MOE_UNARY_SILU: r = (float)(d * moe_sigmoid(d)); break;
    case MOE_UNARY_EXP: r = (float)exp(d); break;
    case MOE_UNARY_LOG: r = (float)log(d); break;
    case MOE_UNARY_SQRT: r = (float)sqrt(d); break;
    default: r = 0.0f / 0.0f; break;
    }
    y[i] = r;
  }
}

// moe_unary_backward_f32 sets gx = gy·fn'(x), with y the forward's output.
extern "C" __global__ void moe_unary_backward_f32(int fn, double p, float *gx, const float *x, const float *y,
                                                  const float *gy, long long n) {
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    double xv = x[i], yv = y[i], gv = gy[i];
    double dy;
    switch (fn) {
    case MOE_UNARY_SCALE: dy = p; break;
    case MOE_UNARY_ADD_SCALAR: dy = 1; break;
    case MOE_UNARY_NEG: dy = -1; break;
    case MOE_UNARY_RELU: dy = xv > 0 ? 1 : 0; break;
    case MOE_UNARY_GELU:
      // Φ(x) + x·φ(x).
      dy = 0.5 * (1.0 + erf(xv * 0.7071067811865476)) + xv * exp(-0.5 * xv * xv) * 0.3989422804014327;
      break;
    case MOE_UNARY_TANH: dy = 1 - yv * yv; break;
    case MOE_UNARY_SIGMOID: dy = yv * (1 - yv); break;
    case MOE_UNARY_SILU: {
      double s = moe_sigmoid(xv);
      dy = s * (1 + xv * (1 - s));
      break;
    }
    case MOE_UNARY_EXP: dy = yv; break;
    case MOE_UNARY_LOG: dy = 1 / xv; break;
    case MOE_UNARY_SQRT: dy = 0.5 / yv; break;
    default: dy = 0.0 / 0.0; break;
    }
    gx[i] = (float)(gv * dy);
  }
}

// moe_binary_f32 sets dst[i] = a[i mod na] fn b[i mod nb], fn being
// gpuhost's binaryFn: 0 add, 1 sub, 2 mul, 3 div. dst may be a or b.
extern "C" __global__ void moe_binary_f32(int fn, float *dst, const float *a, long long na, const float *b,
                                          long long nb, long long n) {
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    float x = a[na == n ? i : i % na];
    float y = b[nb == n ? i : i % nb];
    float r;
    switch (fn) {
    case 0: r = x + y; break;
    case 1: r = x - y; break;
    case 2: r = x * y; break;
    case 3: r = x / y; break;
    default: r = 0.0f / 0.0f; break;
    }
    dst[i] = r;
  }
}

// Source dtypes of moe_cast_f32: gpuhost's castKind values.
#define MOE_CAST_INT32 0
#define MOE_CAST_INT64 1
#define MOE_CAST_BOOL 2

// moe_cast_f32 sets dst[i] = src[i] converted to float32, src being int32,
// int64 or bool (kind): an integer rounded to nearest, ties to even (the
// conversion's rn mode, as the CPU device's Go conversion), a bool 0 for a
// zero byte and 1 for any other.
extern "C" __global__ void moe_cast_f32(float *dst, const void *src, int kind, long long n) {
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    float v;
    if (kind == MOE_CAST_INT32) {
      v = (float)((const int *)src)[i];
    } else if (kind == MOE_CAST_INT64) {
      v = (float)((const long long *)src)[i];
    } else {
      v = ((const unsigned char *)src)[i] != 0 ? 1.0f : 0.0f;
    }
    dst[i] = v;
  }
}

// moe_sum_squares_partial_f64 is the first pass of Σ x² in float64: block b
// writes the sum over its share of the grid-stride loop to partial[b].
extern "C" __global__ void moe_sum_squares_partial_f64(double *partial, const float *x, long long n) {
  __shared__ double s[MOE_ROW_THREADS];
  double acc = 0;
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    double v = x[i];
    acc += v * v;
  }
  acc = moe_block_sum(acc, s);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = acc;
  }
}

// moe_sum_f64 is the second pass: one block sets *out = Σ partial[0..n).
extern "C" __global__ void moe_sum_f64(double *out, const double *partial, int n) {
  __shared__ double s[MOE_ROW_THREADS];
  unsigned t = threadIdx.x;
  double acc = 0;
  for (int i = t; i < n; i += blockDim.x) {
    acc += partial[i];
  }
  acc = moe_block_sum(acc, s);
  if (t == 0) {
    *out = acc;
  }
}
