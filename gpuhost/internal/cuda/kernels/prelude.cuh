// prelude.cuh holds what every kernel file needs. Under nvcc it is empty
// but for includes; the emulator (cudaemu) defines MOEHOST_CUDA_EMU and
// supplies its own definitions of the CUDA built-ins before this file.
#pragma once
#ifndef MOEHOST_CUDA_EMU
#include <cuda_runtime.h>
#endif
