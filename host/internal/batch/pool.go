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
	have      []bool // which results are held
	remaining int
	err       error
	over      bool          // no more results are wanted: failed, abandoned or collected
	done      chan struct{} // closed on the first error or the last result
}

// finished reports whether the request needs no more work: it has failed,
// or its caller gave up.
func (r *request[R]) finished() bool {
	if r.ctx.Err() != nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.over || r.err != nil
}

// complete records piece i's result or error. It returns the results that
// nobody will collect, for the pool to discard: res when the request no
// longer wants it, and the results held so far on the request's first
// error.
func (r *request[R]) complete(i int, res R, err error) (orphans []R) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.over || r.remaining == 0 || r.err != nil {
		if err == nil {
			orphans = append(orphans, res)
		}
		return orphans
	}
	if err != nil {
		r.err = err
		close(r.done)
		return r.takeLocked()
	}
	r.results[i], r.have[i] = res, true
	if r.remaining--; r.remaining == 0 {
		close(r.done)
	}
	return nil
}

// collect hands the caller the results once done is closed, or the
// request's error; either way no more results are wanted.
func (r *request[R]) collect() ([]R, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.over = true
	if r.err != nil {
		return nil, r.err
	}
	res := r.results
	r.results, r.have = nil, nil
	return res, nil
}

// abandon marks the request as given up and returns the results it held,
// which nobody will collect.
func (r *request[R]) abandon() []R {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.over = true
	return r.takeLocked()
}

// takeLocked removes and returns the results held. Call with r.mu held.
func (r *request[R]) takeLocked() []R {
	var out []R
	for i, ok := range r.have {
		if ok {
			out = append(out, r.results[i])
			var zero R
			r.results[i], r.have[i] = zero, false
		}
	}
	return out
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
//
// Submit takes req, whatever it returns: the pool frees it through its Ops
// (see [Ops]) when it has run or will not run, and the caller must not
// touch it after the call. The result, when there is one, is the
// caller's.
func (p *Pool[T, R]) Submit(ctx context.Context, req T) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		p.drop(req)
		return zero, err
	}
	rows := p.ops.Rows(req)
	if rows <= 0 {
		p.drop(req)
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
	var one [1]*piece[T, R]
	r, pcs := p.pieces(payloads, one[:0])
	r.ctx, r.remaining, r.done = ctx, len(payloads), make(chan struct{})
	now := time.Now()
	p.mu.Lock()
	if p.closed != nil {
		err := p.closed
		p.mu.Unlock()
		p.drop(payloads...)
		return zero, err
	}
	var pruned []*piece[T, R]
	if len(p.queue)+len(payloads) > p.lim.QueueSize {
		pruned = p.prune()
	}
	if len(p.queue)+len(payloads) > p.lim.QueueSize {
		depth := len(p.queue)
		p.mu.Unlock()
		p.dropPieces(pruned)
		p.drop(payloads...)
		return zero, fmt.Errorf("%w: %d pieces pending, queue size %d", ErrQueueFull, depth, p.lim.QueueSize)
	}
	for _, pc := range pcs {
		pc.enq = now
		p.queue = append(p.queue, pc)
	}
	p.obs.Queue(len(p.queue))
	p.mu.Unlock()
	p.dropPieces(pruned)
	p.notify()

	select {
	case <-r.done:
	case <-ctx.Done():
		p.withdraw(r)
		p.notify() // the queue may have changed what is ready
		return zero, ctx.Err()
	}
	results, err := r.collect()
	if err != nil {
		p.withdraw(r) // the pieces that have not run
		return zero, err
	}
	if len(results) == 1 {
		return results[0], nil
	}
	return p.ops.Join(results)
}

// unsplit is a request of one piece (most are), its piece and room for
// its result, in one allocation.
type unsplit[T, R any] struct {
	req  request[R]
	pc   piece[T, R]
	res  [1]R
	have [1]bool
}

// pieces makes the request of payloads and appends its pieces to dst,
// all but their enqueue time; the caller sets the request's context,
// count and channel.
func (p *Pool[T, R]) pieces(payloads []T, dst []*piece[T, R]) (*request[R], []*piece[T, R]) {
	if len(payloads) == 1 {
		u := &unsplit[T, R]{}
		u.req.results, u.req.have = u.res[:], u.have[:]
		u.pc = piece[T, R]{req: &u.req, payload: payloads[0], rows: p.ops.Rows(payloads[0])}
		return &u.req, append(dst, &u.pc)
	}
	r := &request[R]{results: make([]R, len(payloads)), have: make([]bool, len(payloads))}
	for i, pl := range payloads {
		dst = append(dst, &piece[T, R]{req: r, idx: i, payload: pl, rows: p.ops.Rows(pl)})
	}
	return r, dst
}

// withdraw takes r's pieces out of the queue and drops them, and discards
// the results r holds: nobody will collect them. Pieces in a running
// batch are the batch's; their results are discarded as they come.
func (p *Pool[T, R]) withdraw(r *request[R]) {
	var mine []*piece[T, R]
	p.mu.Lock()
	live := p.queue[:0]
	for _, pc := range p.queue {
		if pc.req == r {
			mine = append(mine, pc)
		} else {
			live = append(live, pc)
		}
	}
	clear(p.queue[len(live):])
	p.queue = live
	if len(mine) > 0 {
		p.obs.Queue(len(p.queue))
	}
	p.mu.Unlock()
	p.dropPieces(mine)
	p.discard(r.abandon()...)
}

// drop hands payloads that will not run to ops.Drop.
func (p *Pool[T, R]) drop(ts ...T) {
	if p.ops.Drop == nil {
		return
	}
	for _, t := range ts {
		p.ops.Drop(t)
	}
}

// dropPieces drops the payloads of pieces taken out of the queue.
func (p *Pool[T, R]) dropPieces(pcs []*piece[T, R]) {
	for _, pc := range pcs {
		p.drop(pc.payload)
	}
}

// discard hands results that nobody collects to ops.Discard.
func (p *Pool[T, R]) discard(rs ...R) {
	if p.ops.Discard == nil {
		return
	}
	for _, r := range rs {
		p.ops.Discard(r)
	}
}

// prune takes out the pieces whose request is finished and returns them;
// the caller drops them once it has let go of p.mu. Call with p.mu held.
func (p *Pool[T, R]) prune() (pruned []*piece[T, R]) {
	live := p.queue[:0]
	for _, pc := range p.queue {
		if pc.req.finished() {
			pruned = append(pruned, pc)
		} else {
			live = append(live, pc)
		}
	}
	clear(p.queue[len(live):])
	p.queue = live
	return pruned
}

// Poll reports whether the pool has work: the enqueue time of its oldest
// live piece, and the time at which it is ready to run (at or before
// oldest when it is ready now).
func (p *Pool[T, R]) Poll() (oldest, readyAt time.Time, ok bool) {
	p.mu.Lock()
	pruned := p.prune()
	defer p.dropPieces(pruned) // after the unlock below
	defer p.mu.Unlock()
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
	pruned := p.prune()
	var batch []*piece[T, R]
	rows := 0
	for len(p.queue) > 0 && (len(batch) == 0 || rows+p.queue[0].rows <= p.lim.MaxBatchSize) {
		batch = append(batch, p.queue[0])
		rows += p.queue[0].rows
		p.queue[0] = nil
		p.queue = p.queue[1:]
	}
	if len(batch) > 0 {
		p.obs.Queue(len(p.queue))
	}
	p.mu.Unlock()
	p.dropPieces(pruned)
	if len(batch) == 0 {
		return
	}

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
		p.discard(pc.req.complete(pc.idx, res, perr)...)
	}
}

// run calls ops.Run, turning a panic or a wrong result count into an
// error for this batch alone. After a panic the payloads are dropped, as
// Run may not have freed them; the results of a wrong count are discarded.
func (p *Pool[T, R]) run(ctx context.Context, payloads []T) (results []R, err error) {
	defer func() {
		if v := recover(); v != nil {
			p.drop(payloads...)
			results, err = nil, fmt.Errorf("batch panicked: %v", v)
		}
	}()
	results, err = p.ops.Run(ctx, payloads)
	var each Errors
	if errors.As(err, &each) && (len(each) != len(payloads) || len(results) != len(payloads)) {
		p.discard(results...)
		return nil, fmt.Errorf("BUG: batch of %d requests gave %d results and %d errors", len(payloads), len(results), len(each))
	}
	if err == nil && len(results) != len(payloads) {
		p.discard(results...)
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
// when nil), dropping their payloads. A batch that is running finishes.
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
	p.obs.Queue(0)
	p.mu.Unlock()
	var zero R
	for _, pc := range queue {
		p.discard(pc.req.complete(pc.idx, zero, err)...)
		p.drop(pc.payload)
	}
}

type nopObserver struct{}

func (nopObserver) Batch(int, []time.Duration, time.Duration, error) {}
func (nopObserver) Queue(int)                                        {}
