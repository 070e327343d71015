// Package batch queues requests for one expert and forms them into
// batches: hivemind's TaskPool, without its defects. A [Pool] flushes a
// batch when it holds max_batch_size rows, when it holds min_batch_size
// rows, or when its oldest request has waited max_wait, whichever comes
// first; it never flushes a request whose caller has given up; it splits a
// request larger than max_batch_size and joins the pieces back; and it
// refuses work with [ErrQueueFull] instead of growing without bound.
//
// A pool does not run batches by itself: a device worker (package
// host/internal/sched) asks every pool when it is ready ([Pool.Poll]) and runs the
// batch of the pool whose oldest request is oldest ([Pool.RunBatch]).
package batch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/moehost/moehost/internal/batching"
)

// Errors returned by Submit.
var (
	// ErrQueueFull: the pool holds QueueSize pending pieces already.
	ErrQueueFull = errors.New("queue full")
	// ErrClosed: the pool is shut down; the request did not run.
	ErrClosed = errors.New("pool closed")
)

// Limits configure a pool. Zero fields take the defaults. They are
// internal/batching's, the one set of batch limits that the server's
// options and the wire share.
type Limits = batching.Limits

// Ops tells a pool how to handle its payloads: T is a request, R its
// result, both with a leading batch dimension.
//
// Ownership: [Pool.Submit] takes its request, and from then on exactly one
// of these hooks frees each payload, once: Split (the whole request, once
// cut), Run (the requests of a batch), or Drop (a payload that will not
// run). A result belongs to Run until it returns, then to the pool, which
// hands it to its caller (through Join for a split request) or, when
// nobody will collect it, to Discard. This is what lets payloads hold
// device memory that must be freed when the work is over rather than
// when the garbage collector runs.
type Ops[T, R any] struct {
	// Rows returns the batch size of a request.
	Rows func(T) int
	// Split cuts a request into consecutive pieces of the given rows. It
	// takes the request: on success the pieces hold its data and the
	// request itself is freed; on error Split frees whatever it made and
	// the request.
	Split func(T, []int) ([]T, error)
	// Run computes the results of a batch of requests, one result per
	// request, in order. It is called by one device worker at a time.
	// When only some requests failed, Run returns every result it has and
	// an [Errors] with one entry per request, so that each request gets
	// its own result or error. Run takes the requests: it frees each
	// before it returns, except what it hands on in a result. It gives no
	// result for a request that failed (all of them, with an error that
	// is not an Errors).
	Run func(ctx context.Context, batch []T) ([]R, error)
	// Join concatenates the results of a split request's pieces. It takes
	// the pieces: it frees them whether or not it succeeds.
	Join func([]R) (R, error)
	// Drop frees a payload that never ran: it was refused (queue full, a
	// closed pool, no rows), its caller gave up, a sibling piece failed,
	// or the pool closed; also the payloads of a batch whose Run panicked,
	// which Run may have freed in part, so Drop must skip what is freed.
	// Nil: payloads are left to the garbage collector.
	Drop func(T)
	// Discard frees a result that nobody collects: its caller gave up,
	// or another piece of its request failed.
	// Nil: results are left to the garbage collector.
	Discard func(R)
}

// Observer is told about every batch a pool runs, for statistics.
type Observer interface {
	// Batch reports a batch of rows after it ran and before its callers
	// get their answers: how long each piece waited in the queue, how
	// long the batch ran, and its error.
	Batch(rows int, waits []time.Duration, run time.Duration, err error)
	// Queue reports the number of pending pieces after it changed. The
	// pool calls it under its lock, so that reports arrive in the order
	// of the changes (a report made after unlocking could overtake a
	// later one and leave a stale depth for good); it must be quick and
	// must not call back into the pool.
	Queue(depth int)
}

// Errors is the error of a batch in which requests failed one by one: one
// entry per request, in order, nil where the request has its result.
type Errors []error

func (e Errors) Error() string {
	n, first := 0, error(nil)
	for _, err := range e {
		if err != nil {
			if n++; first == nil {
				first = err
			}
		}
	}
	return fmt.Sprintf("%d of %d requests failed; the first: %v", n, len(e), first)
}
