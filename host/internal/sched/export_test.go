package sched

import "time"

// SetClock makes w read time from now, so that tests can charge batches a
// known run time without sleeping. Call it before Start.
func SetClock(w *Worker, now func() time.Time) { w.now = now }
