//go:build !amd64 || purego

package gpuhost

// geluForwardVec has no vector kernel in this build: it does nothing.
func geluForwardVec(y, x []float32, p gemmPath) int { return 0 }

// geluBackwardVec has no vector kernel in this build: it does nothing.
func geluBackwardVec(gx, x, gy []float32, p gemmPath) int { return 0 }

// adamVec has no vector kernel in this build: it does nothing.
func adamVec(p, g, m, v []float32, k *adamLanes, wd bool, path gemmPath) int { return 0 }
