package sandbox

import (
	"context"
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestInitBudgetIsCPUTime checks lowPriority's CPU budget: a thread that
// spins is stopped once it has run for the budget, and one that waits for
// ten times as long in wall time, using no CPU, is not, even when the
// thread ran for longer than the budget before (the clock counts from the
// thread's start).
func TestInitBudgetIsCPUTime(t *testing.T) {
	const budget = 50 * time.Millisecond
	t.Run("spinning", func(t *testing.T) {
		start := time.Now()
		var err error
		over := lowPriority(context.Background(), budget, func(ctx context.Context) {
			for ctx.Err() == nil {
				if time.Since(start) > time.Minute {
					return
				}
			}
			err = context.Cause(ctx)
		})
		if !over || !errors.Is(err, context.Canceled) {
			t.Fatalf("a spinning thread: over budget %t, %v; want stopped at %v of CPU time", over, err, budget)
		}
	})
	t.Run("waiting", func(t *testing.T) {
		var err error
		over := lowPriority(context.Background(), budget, func(ctx context.Context) {
			select {
			case <-ctx.Done():
				err = ctx.Err()
			case <-time.After(10 * budget):
			}
		})
		if over || err != nil {
			t.Fatalf("a thread that waited %v without running: over budget %t, %v; want left alone", 10*budget, over, err)
		}
	})
	t.Run("thread that ran before", func(t *testing.T) {
		done := make(chan bool)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for start := time.Now(); time.Since(start) < 4*budget; {
			}
			tid := syscall.Gettid()
			stop := make(chan struct{})
			watched := make(chan bool, 1)
			go func() { watched <- watchThreadCPU(tid, budget, stop, func() {}) }()
			time.Sleep(4 * budget)
			close(stop)
			done <- <-watched
		}()
		if <-done {
			t.Fatalf("a thread that had spun for %v and then waited was over its budget of %v", 4*budget, budget)
		}
	})
}
