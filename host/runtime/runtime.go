// Package runtime runs batches on a device: hivemind's Runtime. One
// worker per device asks every pool whether it is ready and runs one batch
// at a time from the ready pool whose oldest request is oldest, so that no
// pool starves (hivemind before #505 served the newest pool first). A
// failing batch fails only its own requests; the worker carries on.
package runtime

import (
	"context"
	"sync"
	"time"
)

// Pool is a queue of requests that can be formed into batches; package
// batch implements it.
type Pool interface {
	// Poll returns the enqueue time of the oldest pending request and
	// the time the pool becomes ready; ok is false when it is empty.
	Poll() (oldest, readyAt time.Time, ok bool)
	// RunBatch forms one batch and runs it to the end.
	RunBatch(ctx context.Context)
}

// Worker runs the batches of a set of pools, one at a time.
type Worker struct {
	wake chan struct{}

	mu    sync.Mutex
	pools []Pool

	quit    chan struct{}
	abort   context.CancelFunc // cancels the running batch
	stopped chan struct{}
	once    sync.Once
}

// NewWorker makes a worker that is not yet running.
func NewWorker() *Worker {
	return &Worker{wake: make(chan struct{}, 1), quit: make(chan struct{}), stopped: make(chan struct{})}
}

// Add makes the worker serve p.
func (w *Worker) Add(p Pool) {
	w.mu.Lock()
	w.pools = append(w.pools, p)
	w.mu.Unlock()
	w.Notify()
}

// Notify wakes the worker to look at its pools again. It never blocks.
func (w *Worker) Notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Start runs the worker in a goroutine until Close. ctx's values reach
// every batch's context; its cancellation does not stop the worker.
func (w *Worker) Start(ctx context.Context) {
	ctx, w.abort = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(w.stopped)
		w.loop(ctx)
	}()
}

// Close stops the worker once the batch it is running, if any, ends, and
// waits for it. If ctx ends first, the running batch is cancelled. Pending
// requests stay in their pools; close those first.
func (w *Worker) Close(ctx context.Context) {
	if w.abort == nil {
		return
	}
	w.once.Do(func() { close(w.quit) })
	select {
	case <-w.stopped:
	case <-ctx.Done():
		w.abort()
		<-w.stopped
	}
	w.abort()
}

func (w *Worker) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-w.quit:
			return
		default:
		}
		p, next := w.pick(time.Now())
		if p != nil {
			p.RunBatch(ctx)
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-w.quit:
			return
		case <-w.wake:
		case <-timer.C:
		}
	}
}

// pick returns the ready pool whose oldest request is oldest, or nil and
// the earliest time a pool becomes ready (zero when all are empty).
func (w *Worker) pick(now time.Time) (Pool, time.Time) {
	w.mu.Lock()
	pools := w.pools
	w.mu.Unlock()
	var (
		best       Pool
		bestOldest time.Time
		next       time.Time
	)
	for _, p := range pools {
		oldest, readyAt, ok := p.Poll()
		if !ok {
			continue
		}
		if !readyAt.After(now) {
			if best == nil || oldest.Before(bestOldest) {
				best, bestOldest = p, oldest
			}
		} else if next.IsZero() || readyAt.Before(next) {
			next = readyAt
		}
	}
	return best, next
}
