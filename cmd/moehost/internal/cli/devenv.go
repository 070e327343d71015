package cli

import (
	"os"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/internal/benchenv"
)

// deviceEnv returns the device options that the environment asks for:
// MOEHOST_GEMM's GEMM path (tests and benchmarks), and where
// MOEHOST_CUBLAS, CUDA_HOME and CUDA_PATH put cuBLAS. gpuhost reads no
// environment; the command does, and hands them to the host.
func deviceEnv() host.Option {
	return host.WithDeviceOptions(gpuhost.WithGEMMPath(os.Getenv(benchenv.GEMM)), gpuhost.WithCUBLAS(benchenv.CUBLASPaths()...))
}
