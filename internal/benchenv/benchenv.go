// Package benchenv names the environment variables that tests,
// benchmarks and cmd/ read and turn into gpuhost's device options. The
// libraries read no environment: this package is where a test binary or
// the moehost command looks, so that no library user mistakes them for
// configuration of the packages themselves.
package benchenv

import (
	"os"
	"path/filepath"
)

// GEMM, set to avx2, avx512 or go, names the GEMM path that new CPU
// devices run instead of the best one the CPU supports
// (gpuhost.WithGEMMPath), so that tests can cover every path and
// benchmarks can compare them. gpuhost's test binary and the moehost
// command read it.
const GEMM = "MOEHOST_GEMM"

// CUBLAS names the cuBLAS library's file, for machines whose loader does
// not find it (gpuhost.WithCUBLAS).
const CUBLAS = "MOEHOST_CUBLAS"

// CUBLASPaths returns where a CUDA device should look for cuBLAS before
// the loader's own search, from the environment: $MOEHOST_CUBLAS, then
// $CUDA_HOME/lib64 and $CUDA_PATH/lib64, those that are set.
func CUBLASPaths() []string {
	var out []string
	if p := os.Getenv(CUBLAS); p != "" {
		out = append(out, p)
	}
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if dir := os.Getenv(env); dir != "" {
			out = append(out, filepath.Join(dir, "lib64"))
		}
	}
	return out
}
