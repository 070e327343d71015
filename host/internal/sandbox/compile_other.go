//go:build !linux

package sandbox

import (
	"context"
	"time"
)

// lowPriority runs f; only Linux lowers the priority of one thread, and
// only there is the CPU budget kept apart from the wall-time bound.
func lowPriority(ctx context.Context, cpu time.Duration, f func(context.Context)) (overCPU bool) {
	f(ctx)
	return false
}

// initWallFactor is 1 where the init's CPU budget is its wall time.
const initWallFactor = 1
