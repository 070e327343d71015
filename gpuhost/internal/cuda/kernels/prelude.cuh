// prelude.cuh holds what every kernel file needs. Under nvcc it is empty
// but for includes; the emulator (cudaemu) defines MOEHOST_CUDA_EMU and
// supplies its own definitions of the CUDA built-ins before this file
// (gpuhost/internal/cuda/emu.h).
//
// Two conventions keep one source for both:
//   - every kernel file ends with MOE_EMU_KERNEL(name) for each kernel it
//     defines, which registers it with the emulator (empty under nvcc);
//   - dynamic shared memory is declared with MOE_EXTERN_SHARED(T, name)
//     instead of extern __shared__ T name[].
#pragma once
#ifndef MOEHOST_CUDA_EMU
#include <cuda_runtime.h>
#define MOE_EMU_KERNEL(k)
#define MOE_EXTERN_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif
