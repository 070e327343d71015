// emu_testkernels.h holds kernels that only the emulator's tests launch:
// they check its thread model, and are not part of moehost.cu.
#pragma once

// moe_emutest_blocksum sets out[blockIdx.x] to the sum of in's elements
// blockIdx.x·blockDim.x .. +blockDim.x with a shared-memory tree that
// needs every __syncthreads it has. blockDim.x is a power of two ≤ 1024.
extern "C" __global__ void moe_emutest_blocksum(float *out, const float *in) {
  __shared__ float s[1024];
  unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned h = blockDim.x / 2; h > 0; h /= 2) {
    if (t < h) {
      s[t] += s[t + h];
    }
    __syncthreads();
  }
  if (t == 0) {
    out[blockIdx.x] = s[0];
  }
}
MOE_EMU_KERNEL(moe_emutest_blocksum)

// moe_emutest_racy is moe_emutest_blocksum without the barriers inside
// the tree: a GPU may give a wrong sum, and so must the emulator.
extern "C" __global__ void moe_emutest_racy(float *out, const float *in) {
  __shared__ float s[1024];
  unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned h = blockDim.x / 2; h > 0; h /= 2) {
    if (t < h) {
      s[t] += s[t + h];
    }
  }
  if (t == 0) {
    out[blockIdx.x] = s[0];
  }
}
MOE_EMU_KERNEL(moe_emutest_racy)

// moe_emutest_ids writes each thread's flattened 3-D thread and block
// index: out[b·T + t] = b·T + t for T threads a block.
extern "C" __global__ void moe_emutest_ids(int *out, long long dummy, unsigned u, double d) {
  unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned T = blockDim.x * blockDim.y * blockDim.z;
  out[b * T + t] = (int)(b * T + t) + (int)dummy + (int)u + (int)d;
}
MOE_EMU_KERNEL(moe_emutest_ids)

// moe_emutest_dynshared copies in through dynamic shared memory, read
// back in reverse thread order after a barrier.
extern "C" __global__ void moe_emutest_dynshared(float *out, const float *in) {
  MOE_EXTERN_SHARED(float, buf);
  unsigned t = threadIdx.x;
  buf[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  out[blockIdx.x * blockDim.x + t] = buf[blockDim.x - 1 - t];
}
MOE_EMU_KERNEL(moe_emutest_dynshared)

// moe_emutest_lastblock has every block's thread 0 write its block index
// to *out: what stays is the block that ran last.
extern "C" __global__ void moe_emutest_lastblock(int *out) {
  if (threadIdx.x == 0) {
    *out = (int)(blockIdx.x + gridDim.x * blockIdx.y);
  }
}
MOE_EMU_KERNEL(moe_emutest_lastblock)
