package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestInitBudgetIsCPUTime checks lowPriority's CPU budget: a thread that
// spins is stopped once it has run for the budget, and one that waits for
// ten times as long in wall time, using no CPU, is not.
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
}
