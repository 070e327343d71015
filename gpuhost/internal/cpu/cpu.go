// Package cpu holds the kernels of gpuhost's CPU device, on float32
// slices: the GEMM (Goto's blocking over generated AVX2 and AVX-512
// micro-kernels, and a portable Go one), its dot kernels for few rows,
// the row kernels of gelu, layer_norm, softmax, Adam and the residual
// add, the caches and CPUID they are sized by, the helper goroutines
// they split work across, and huge-page advice for their storage. It
// knows nothing of tensors, ops or devices: gpuhost's cpuDevice checks
// shapes and hands slices here, as gpuhost/internal/cuda holds the CUDA
// driver under the CUDA device.
//
// Each kernel runs on a Path, the width of its vector kernels; Named
// picks one, checking the AVX-512 kernel once per process first.
package cpu

//go:generate sh -c "go run ../asmgen/main.go > gemm_amd64.s"
