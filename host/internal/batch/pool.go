package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// request is one Submit call; its pieces may run in different batches.
type request[R any] struct {
	ctx context.Context

	mu        sync.Mutex
	results   []R
	remaining int
	err       error
	done      chan struct{} // closed on the first error or the last result
}

// finished reports whether the request needs no more work: it has failed,
// or its caller gave up.
func (r *request[R]) finished() bool {
	if r.ctx.Err() != nil {
		return true
	}
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *request[R]) complete(i int, res R, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.remaining == 0 || r.err != nil {
		return
	}
	if err != nil {
		r.err = err
		close(r.done)
		return
	}
	r.results[i] = res
	if r.remaining--; r.remaining == 0 {
		close(r.done)
	}
}

type piece[T, R any] struct {
	req     *request[R]
	idx     int
	payload T
	rows    int
	enq     time.Time
}

// Pool is the queue of one expert's requests of one kind (forward or
// backward). It is safe for concurrent use.
type Pool[T, R any] struct {
	lim    Limits
	ops    Ops[T, R]
	obs    Observer
	notify func()

	mu     sync.Mutex
	queue  []*piece[T, R]
	closed error
}

// NewPool makes a pool. notify is called whenever the pool may have become
// ready, to wake the device worker; obs may be nil.
func NewPool[T, R any](lim Limits, ops Ops[T, R], obs Observer, notify func()) *Pool[T, R] {
	if obs == nil {
		obs = nopObserver{}
	}
	return &Pool[T, R]{lim: lim.WithDefaults(), ops: ops, obs: obs, notify: notify}
}

// Limits returns the pool's limits, with defaults filled in.
func (p *Pool[T, R]) Limits() Limits { return p.lim }

// Submit queues req and waits for its result. A request larger than
// MaxBatchSize is split into pieces that may run in different batches, and
// their results are joined. If ctx ends first, Submit returns ctx's error
// at once and the request is dropped before it takes batch space.
func (p *Pool[T, R]) Submit(ctx context.Context, req T) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	rows := p.ops.Rows(req)
	if rows <= 0 {
		return zero, fmt.Errorf("request has %d rows; a batch needs at least one", rows)
	}
	payloads := []T{req}
	if rows > p.lim.MaxBatchSize {
		var sizes []int
		for left := rows; left > 0; left -= p.lim.MaxBatchSize {
			sizes = append(sizes, min(left, p.lim.MaxBatchSize))
		}
		var err error
		if payloads, err = p.ops.Split(req, sizes); err != nil {
			return zero, fmt.Errorf("splitting a request of %d rows: %w", rows, err)
		}
	}
	r := &request[R]{ctx: ctx, results: make([]R, len(payloads)), remaining: len(payloads), done: make(chan struct{})}
	now := time.Now()
	p.mu.Lock()
	if p.closed != nil {
		p.mu.Unlock()
		return zero, p.closed
	}
	if len(p.queue)+len(payloads) > p.lim.QueueSize {
		p.prune()
	}
	if len(p.queue)+len(payloads) > p.lim.QueueSize {
		depth := len(p.queue)
		p.mu.Unlock()
		return zero, fmt.Errorf("%w: %d pieces pending, queue size %d", ErrQueueFull, depth, p.lim.QueueSize)
	}
	for i, pl := range payloads {
		p.queue = append(p.queue, &piece[T, R]{req: r, idx: i, payload: pl, rows: p.ops.Rows(pl), enq: now})
	}
	depth := len(p.queue)
	p.mu.Unlock()
	p.obs.Queue(depth)
	p.notify()

	select {
	case <-r.done:
	case <-ctx.Done():
		p.notify() // the queue may have changed what is ready
		return zero, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return zero, r.err
	}
	if len(r.results) == 1 {
		return r.results[0], nil
	}
	return p.ops.Join(r.results)
}

// prune drops pieces whose request is finished. Call with p.mu held.
func (p *Pool[T, R]) prune() {
	live := p.queue[:0]
	for _, pc := range p.queue {
		if !pc.req.finished() {
			live = append(live, pc)
		}
	}
	clear(p.queue[len(live):])
	p.queue = live
}

// Poll reports whether the pool has work: the enqueue time of its oldest
// live piece, and the time at which it is ready to run (at or before
// oldest when it is ready now).
func (p *Pool[T, R]) Poll() (oldest, readyAt time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prune()
	if len(p.queue) == 0 {
		return time.Time{}, time.Time{}, false
	}
	oldest = p.queue[0].enq
	rows := 0
	for _, pc := range p.queue {
		if rows += pc.rows; rows >= p.lim.MinBatchSize {
			return oldest, oldest, true
		}
	}
	return oldest, oldest.Add(p.lim.MaxWait), true
}

// Depth returns the number of pending pieces.
func (p *Pool[T, R]) Depth() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// RunBatch takes up to MaxBatchSize rows of live pieces, oldest first, runs
// them as one batch and delivers each piece's result or the batch's error.
// ctx bounds the run; the batch is also cancelled when every caller in it
// has given up, and it ends no later than the latest caller deadline.
func (p *Pool[T, R]) RunBatch(ctx context.Context) {
	p.mu.Lock()
	p.prune()
	var batch []*piece[T, R]
	rows := 0
	for len(p.queue) > 0 && (len(batch) == 0 || rows+p.queue[0].rows <= p.lim.MaxBatchSize) {
		batch = append(batch, p.queue[0])
		rows += p.queue[0].rows
		p.queue[0] = nil
		p.queue = p.queue[1:]
	}
	depth := len(p.queue)
	p.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	p.obs.Queue(depth)

	start := time.Now()
	waits := make([]time.Duration, len(batch))
	payloads := make([]T, len(batch))
	for i, pc := range batch {
		waits[i] = start.Sub(pc.enq)
		payloads[i] = pc.payload
	}
	bctx, cancel := batchContext(ctx, batch)
	results, err := p.run(bctx, payloads)
	cancel()
	// The batch is counted before anyone gets its answer, so that a
	// caller that has its result sees the batch in the pool's stats.
	p.obs.Batch(rows, waits, time.Since(start), err)
	var each Errors
	if !errors.As(err, &each) || len(each) != len(batch) || len(results) != len(batch) {
		each = nil
	}
	for i, pc := range batch {
		var res R
		perr := err
		if each != nil {
			perr = each[i]
		}
		if perr == nil {
			res = results[i]
		}
		pc.req.complete(pc.idx, res, perr)
	}
}

// run calls ops.Run, turning a panic or a wrong result count into an
// error for this batch alone.
func (p *Pool[T, R]) run(ctx context.Context, payloads []T) (results []R, err error) {
	defer func() {
		if v := recover(); v != nil {
			results, err = nil, fmt.Errorf("batch panicked: %v", v)
		}
	}()
	results, err = p.ops.Run(ctx, payloads)
	var each Errors
	if errors.As(err, &each) && (len(each) != len(payloads) || len(results) != len(payloads)) {
		return nil, fmt.Errorf("BUG: batch of %d requests gave %d results and %d errors", len(payloads), len(results), len(each))
	}
	if err == nil && len(results) != len(payloads) {
		return nil, fmt.Errorf("BUG: batch of %d requests gave %d results", len(payloads), len(results))
	}
	return results, err
}

// batchContext derives the context a batch runs under: done when ctx is,
// when every caller in the batch has given up, or at the latest of the
// callers' deadlines if all have one.
func batchContext[T, R any](ctx context.Context, batch []*piece[T, R]) (context.Context, context.CancelFunc) {
	var latest time.Time
	allDeadlines := true
	for _, pc := range batch {
		d, ok := pc.req.ctx.Deadline()
		allDeadlines = allDeadlines && ok
		if ok && d.After(latest) {
			latest = d
		}
	}
	var cancel context.CancelFunc
	if allDeadlines {
		ctx, cancel = context.WithDeadline(ctx, latest)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	var mu sync.Mutex
	live := len(batch)
	stops := make([]func() bool, len(batch))
	for i, pc := range batch {
		stops[i] = context.AfterFunc(pc.req.ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if live--; live == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// Close refuses new requests and fails the queued ones with err (ErrClosed
// when nil). A batch that is running finishes.
func (p *Pool[T, R]) Close(err error) {
	if err == nil {
		err = ErrClosed
	} else if !errors.Is(err, ErrClosed) {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	p.mu.Lock()
	if p.closed == nil {
		p.closed = err
	}
	queue := p.queue
	p.queue = nil
	p.mu.Unlock()
	var zero R
	for _, pc := range queue {
		pc.req.complete(pc.idx, zero, err)
	}
	p.obs.Queue(0)
}

type nopObserver struct{}

func (nopObserver) Batch(int, []time.Duration, time.Duration, error) {}
func (nopObserver) Queue(int)                                        {}
