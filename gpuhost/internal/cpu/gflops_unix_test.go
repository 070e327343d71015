//go:build unix

package cpu

import (
	"syscall"
	"time"
)

// gflops runs fn (one call warms up) for about window and returns the
// rate of flop per call in GFLOP/s of wall time and per CPU-second of the
// process: the kernel table (TestKernelTable) and the A/B runs
// (TestGemmAB) measure with it.
func gflops(fn func(), flop float64, window time.Duration) (wall, cpu float64) {
	fn()
	c0 := cpuTime()
	start, n := time.Now(), 0
	for n == 0 || time.Since(start) < window {
		fn()
		n++
	}
	el, used := time.Since(start).Seconds(), (cpuTime() - c0).Seconds()
	return flop * float64(n) / el / 1e9, flop * float64(n) / max(used, 1e-9) / 1e9
}

// cpuTime returns the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
