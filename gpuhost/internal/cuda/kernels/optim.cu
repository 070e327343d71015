// optim.cu holds the optimizer kernels. They follow the CPU device's
// sgdStep and adamStep (gpuhost/cpu_kernels.go) operation for operation,
// with every product rounded to float32 on its own (__fmul_rn, never a
// fused multiply-add), so that a step gives the CPU's bits.

// moe_sgd_step_f32 is one step of torch.optim.SGD: g = g·scale + wd·p;
// buf = momentum·buf + g when buf is not null; p −= lr·g (or lr·buf).
extern "C" __global__ void moe_sgd_step_f32(float *p, const float *g, float *buf, long long n, float lr,
                                            float momentum, float wd, float scale) {
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    float pv = p[i];
    float gv = g[i];
    if (scale != 1.0f) {
      gv = __fmul_rn(gv, scale);
    }
    if (wd != 0.0f) {
      gv = __fadd_rn(gv, __fmul_rn(wd, pv));
    }
    if (buf != nullptr) {
      float b = __fadd_rn(__fmul_rn(momentum, buf[i]), gv);
      buf[i] = b;
      gv = b;
    }
    p[i] = __fsub_rn(pv, __fmul_rn(lr, gv));
  }
}

// moe_adam_step_f32 is one step of torch.optim.Adam, or AdamW when
// decoupled: g = g·scale (+ wd·p for Adam; AdamW multiplies p by decay,
// 1 − lr·wd in float64); m = m + w1·(g − m); v = b2·v + w2·g·g;
// p −= step·m/(√v/bc2s + eps).
extern "C" __global__ void moe_adam_step_f32(float *p, const float *g, float *m, float *v, long long n, float wd,
                                             double decay, int decoupled, float scale, float w1, float b2, float w2,
                                             float step, float bc2s, float eps) {
  for (long long i = moe_grid_start(); i < n; i += moe_grid_stride()) {
    float pv = p[i];
    float gv = g[i];
    if (scale != 1.0f) {
      gv = __fmul_rn(gv, scale);
    }
    if (wd != 0.0f) {
      if (decoupled) {
        pv = (float)__dmul_rn((double)pv, decay);
      } else {
        gv = __fadd_rn(gv, __fmul_rn(wd, pv));
      }
    }
    float mi = m[i];
    float mv = __fadd_rn(mi, __fmul_rn(w1, __fsub_rn(gv, mi)));
    float vv = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(w2, gv), gv));
    m[i] = mv;
    v[i] = vv;
    float den = __fadd_rn(__fdiv_rn((float)sqrt((double)vv), bc2s), eps);
    p[i] = __fsub_rn(pv, __fmul_rn(step, __fdiv_rn(mv, den)));
  }
}
