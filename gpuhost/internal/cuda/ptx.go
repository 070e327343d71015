//go:build cuda || cudaemu

package cuda

import _ "embed"

// ptx is the kernels' PTX for compute_80, which the driver JIT-compiles
// for the GPU at hand (Ampere, Hopper and later) when a context opens.
//
// Rebuild it with: make generate-cuda
//
//go:embed kernels/moehost.ptx
var ptx string

// ptxKernels are the kernels of ptx with their parameter types, for
// Launch to check its arguments against: the real backend because a GPU
// reads mismatched arguments as garbage, the emulator so that every test
// on it checks the Go call sites against the PTX a GPU will run.
var ptxKernels = ptxParams(ptx)
