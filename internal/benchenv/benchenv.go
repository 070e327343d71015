// Package benchenv names the environment switches that only benchmarks
// set. They live here, not in a public API, so that no library user
// mistakes them for configuration.
package benchenv

// ExactPool, set to 1 in the environment, gives new CPU devices the pool
// that moehost had before size classes: buffers reused only at their exact
// length, up to 1 GiB, never trimmed. It exists so that benchmarks can
// measure the size classes against it in one run; nothing else should set
// it.
const ExactPool = "MOEHOST_BENCH_EXACT_POOL"

// GEMM, set to avx2, avx512 or go, makes new CPU devices run that GEMM
// path instead of the best one the CPU supports, so that tests can cover
// every path and benchmarks can compare them. A path the CPU or build
// lacks is refused with a log line. Nothing else should set it.
const GEMM = "MOEHOST_GEMM"
