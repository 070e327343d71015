package sandbox

import (
	"context"
	"testing"
	"time"
)

// TestGuestClock checks the clock a guest reads: 1 ms a reading plus what
// it slept, whether the sleep waited (in a call), returned at once
// (outside one) or was cut short by the call's stop.
func TestGuestClock(t *testing.T) {
	st := &state{phase: phaseInit}
	c := &guestClock{st: st}
	if a, b := c.nanotime(), c.nanotime(); b-a != clockTick {
		t.Errorf("two readings %d apart, want %d", b-a, clockTick)
	}
	const long = int64(time.Hour)
	before := c.nanotime()
	start := time.Now()
	c.nanosleep(long)
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("a sleep in moe_init waited %v", took)
	}
	if moved := c.nanotime() - before; moved != long+clockTick {
		t.Errorf("the clock moved %d over an hour's sleep, want %d", moved, long+clockTick)
	}

	st.phase = phaseForward
	ctx, cancel := context.WithCancel(context.Background())
	st.stop = ctx
	start = time.Now()
	c.nanosleep(int64(30 * time.Millisecond))
	if took := time.Since(start); took < 30*time.Millisecond || st.sleepCut {
		t.Errorf("a 30 ms sleep in a call took %v (cut %t)", took, st.sleepCut)
	}
	// (10 s, so that a sleep the stop does not cut fails in 10 s.)
	const cut = int64(10 * time.Second)
	time.AfterFunc(20*time.Millisecond, cancel)
	before = c.nanotime()
	start = time.Now()
	c.nanosleep(cut)
	if took := time.Since(start); took > 5*time.Second || !st.sleepCut {
		t.Errorf("a 10 s sleep stopped after 20 ms took %v (cut %t)", took, st.sleepCut)
	}
	if moved := c.nanotime() - before; moved != cut+clockTick {
		t.Errorf("the clock moved %d over a cut sleep, want the whole %d", moved, cut+clockTick)
	}
}
