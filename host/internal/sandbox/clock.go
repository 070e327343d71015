package sandbox

import (
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/sys"
)

// guestClock is an instance's monotonic clock and sleep, behind WASI's
// clock_time_get and poll_oneoff. The clock tells the guest nothing about
// the host: it moves 1 ms at each reading, as wazero's fake clock does,
// and by the time the guest slept, never by the host's own time. A sleep
// really waits, so that an expert can be slow on purpose, as hivemind's
// nop_delay is, but only while a moe_forward or moe_backward call runs,
// and only until the call is stopped (its callers left or its call
// timeout passed). Outside a call (moe_init, _initialize) and once the
// call is stopped a sleep returns at once. Either way the clock moves by
// the whole sleep, so that the guest's runtime finds its timer due and
// goes on; a call whose sleep was cut short fails as stopped, whatever
// the guest returns (Instance.call).
//
// A sleeping guest holds its instance and its batch, as a guest that
// spins for as long would, but no core and not the device: WASI calls run
// outside the batch's Gate, and the call timeout bounds both.
type guestClock struct {
	st  *state
	now atomic.Int64 // nanoseconds
}

// clockTick is how far each reading moves the clock (wazero's fake one
// does the same), so that a guest that waits by reading the clock in a
// loop ends.
const clockTick = int64(time.Millisecond)

// clockResolution is the resolution the clock reports.
const clockResolution = sys.ClockResolution(1000) // 1 µs

// nanotime implements sys.Nanotime.
func (c *guestClock) nanotime() int64 { return c.now.Add(clockTick) }

// nanosleep implements sys.Nanosleep: it waits up to ns within a call,
// until the call's stop, and moves the clock by ns.
func (c *guestClock) nanosleep(ns int64) {
	if ns <= 0 {
		return
	}
	defer c.now.Add(ns)
	st := c.st
	if !st.phase.inCall() || st.stop == nil {
		return
	}
	t := time.NewTimer(time.Duration(ns))
	defer t.Stop()
	select {
	case <-t.C:
	case <-st.stop.Done():
		st.sleepCut = true
	}
}
