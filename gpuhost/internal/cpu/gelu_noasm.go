//go:build !amd64 || purego

package cpu

// geluForwardVec has no vector kernel in this build: it does nothing.
func geluForwardVec(y, x []float32, p Path) int { return 0 }

// geluBackwardVec has no vector kernel in this build: it does nothing.
func geluBackwardVec(gx, x, gy []float32, p Path) int { return 0 }

// adamVec has no vector kernel in this build: it does nothing.
func adamVec(p, g, m, v []float32, k *AdamLanes, wd bool, path Path) int { return 0 }
