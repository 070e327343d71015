// Package sched runs batches on a device: hivemind's Runtime. One
// worker per device runs one batch at a time.
//
// Pools belong to groups (tenants; a pool added without WithGroup belongs
// to the operator's group ""). The worker shares device time between the
// groups that have work by deficit round robin, charged with each batch's
// measured run time, so a tenant with many busy experts gets no more time
// than a tenant with one. Within a group it runs the ready pool whose
// oldest request is oldest, so that no pool starves (hivemind before #505
// served the newest pool first). A group whose queues empty keeps no
// credit.
//
// Batches are not preemptive: once one starts it runs to its end. A group
// that gets work waits for the batch that is running and, at most, for one
// turn of each group ahead of it in the round; a turn is one batch when
// batches run past the quantum (1 ms × weight). With two tenants, one's
// wait is bounded by one batch of the other.
//
// A failing batch fails only its own requests; the worker carries on.
package sched

import (
	"context"
	"math"
	goruntime "runtime"
	"sync"
	"time"
)

// Pool is a queue of requests that can be formed into batches; package
// batch implements it. A Pool must be comparable (a pointer, in practice):
// Remove finds it by ==.
type Pool interface {
	// Poll returns the enqueue time of the oldest pending request and
	// the time the pool becomes ready; ok is false when it is empty.
	Poll() (oldest, readyAt time.Time, ok bool)
	// RunBatch forms one batch and runs it to the end.
	RunBatch(ctx context.Context)
}

// AddOption configures how the worker schedules one pool.
type AddOption interface {
	apply(*addConfig)
}

type addConfig struct {
	group  string
	weight float64
}

type addOptionFunc func(*addConfig)

func (f addOptionFunc) apply(c *addConfig) { f(c) }

// WithGroup puts the pool in group name (a tenant) with the given weight:
// over time, backlogged groups get device time in proportion to their
// weights. Without it a pool is in the operator's group "" with weight 1.
// A weight that is not a positive finite number counts as 1. A group's
// weight is the one its latest Add gave.
func WithGroup(name string, weight float64) AddOption {
	return addOptionFunc(func(c *addConfig) {
		c.group = name
		c.weight = weight
	})
}

// quantum is the run time a group is granted each time its turn comes
// round. A batch may run past it (the group then owes the excess), so it
// sets only how finely turns interleave, not how fair they are.
const quantum = float64(time.Millisecond)

// group is one tenant's share of the worker.
type group struct {
	name string
	// Under Worker.mu.
	weight float64
	pools  int

	// Touched by the worker goroutine only.
	deficit float64   // run time (ns) the group may still use this turn; negative: owed
	active  bool      // in Worker.ring
	mark    uint64    // pick epoch in which ready/pending were set
	pending bool      // some pool has requests
	ready   Pool      // its ready pool with the oldest request
	oldest  time.Time // that request's enqueue time
}

type entry struct {
	p Pool
	g *group
}

// Worker runs the batches of a set of pools, one at a time.
type Worker struct {
	wake chan struct{}
	now  func() time.Time // time.Now; tests swap in a fake clock

	mu      sync.Mutex
	pools   []entry // copied on write: pick reads a snapshot
	groups  map[string]*group
	running Pool       // the pool whose batch runs now, if any
	ended   *sync.Cond // broadcast when a batch ends

	// Deficit round robin state, worker goroutine only.
	ring    []*group // groups with pending requests, in turn order
	cursor  int      // ring index of the group whose turn it is
	granted bool     // ring[cursor] got its quantum for this turn
	epoch   uint64

	quit    chan struct{}
	abort   context.CancelFunc // cancels the running batch
	stopped chan struct{}
	once    sync.Once
}

// NewWorker makes a worker that is not yet running.
func NewWorker() *Worker {
	w := &Worker{
		wake:    make(chan struct{}, 1),
		now:     time.Now,
		groups:  make(map[string]*group),
		quit:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	w.ended = sync.NewCond(&w.mu)
	return w
}

// Add makes the worker serve p, in the operator's group unless an option
// says otherwise.
func (w *Worker) Add(p Pool, opts ...AddOption) {
	c := addConfig{weight: 1}
	for _, o := range opts {
		o.apply(&c)
	}
	if !(c.weight > 0) || math.IsInf(c.weight, 0) {
		c.weight = 1
	}
	w.mu.Lock()
	g := w.groups[c.group]
	if g == nil {
		g = &group{name: c.group}
		w.groups[c.group] = g
	}
	g.weight = c.weight
	g.pools++
	pools := make([]entry, len(w.pools), len(w.pools)+1)
	copy(pools, w.pools)
	w.pools = append(pools, entry{p: p, g: g})
	w.mu.Unlock()
	w.Notify()
}

// Remove stops the worker serving p. If a batch of p is running, Remove
// waits for it to end, so that on return nothing of p runs or will run;
// its pending requests stay in p for the caller to fail or drain. Remove
// is safe while the worker runs, but must not be called from p's own
// RunBatch. Removing a pool that was never added does nothing.
func (w *Worker) Remove(p Pool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	pools := make([]entry, 0, len(w.pools))
	for _, e := range w.pools {
		if e.p != p {
			pools = append(pools, e)
			continue
		}
		if e.g.pools--; e.g.pools == 0 {
			delete(w.groups, e.g.name)
		}
	}
	w.pools = pools
	for w.running == p && p != nil {
		w.ended.Wait()
	}
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
		p, g, next := w.pick(w.now())
		if p != nil {
			w.run(ctx, p, g)
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(w.now()), 0)
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

// run runs one batch of p, unless p was removed since pick, and charges
// its run time to g.
func (w *Worker) run(ctx context.Context, p Pool, g *group) {
	w.mu.Lock()
	live := false
	for _, e := range w.pools {
		if e.p == p {
			live = true
			break
		}
	}
	if !live {
		w.mu.Unlock()
		return
	}
	w.running = p
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.running = nil
		w.ended.Broadcast()
		w.mu.Unlock()
	}()
	start := w.now()
	p.RunBatch(ctx)
	g.deficit -= float64(w.now().Sub(start))
	// The batch's callers were woken on this goroutine's P, where Go
	// queues them to run next; but the next batch would keep the P, and
	// with every other P in its kernels they waited for the OS to
	// schedule another thread: 2-4 ms on 2 cores, twice a tenant's whole
	// wait (make test-fairness). Yielding lets them return first.
	goruntime.Gosched()
}

// pick returns the pool to run next and its group, or nil and the
// earliest time a pool becomes ready (zero when all are empty).
//
// Groups with pending requests form a ring. The group whose turn it is
// gets quantum × weight added to its deficit once per turn, and keeps the
// turn while its deficit is positive and it has a ready pool; each batch
// is charged its run time afterwards. A group whose queues are empty
// leaves the ring and loses any credit left (a debt, at most one batch,
// stays). A group that is pending but not yet ready is passed over.
func (w *Worker) pick(now time.Time) (Pool, *group, time.Time) {
	w.mu.Lock()
	pools := w.pools
	w.mu.Unlock()

	w.epoch++
	var next time.Time
	anyReady := false
	for _, e := range pools {
		g := e.g
		if g.mark != w.epoch {
			g.mark, g.pending, g.ready = w.epoch, false, nil
		}
		oldest, readyAt, ok := e.p.Poll()
		if !ok {
			continue
		}
		g.pending = true
		if !readyAt.After(now) {
			anyReady = true
			if g.ready == nil || oldest.Before(g.oldest) {
				g.ready, g.oldest = e.p, oldest
			}
		} else if next.IsZero() || readyAt.Before(next) {
			next = readyAt
		}
	}

	// Groups that emptied (or lost all their pools) leave the ring; newly
	// pending groups join at its end.
	ring := w.ring[:0]
	for i, g := range w.ring {
		if g.mark == w.epoch && g.pending {
			ring = append(ring, g)
			continue
		}
		g.active = false
		g.deficit = min(g.deficit, 0)
		if i < w.cursor {
			w.cursor--
		} else if i == w.cursor {
			w.granted = false
		}
	}
	for _, e := range pools {
		if g := e.g; g.mark == w.epoch && g.pending && !g.active {
			g.active = true
			ring = append(ring, g)
		}
	}
	if len(ring) < len(w.ring) {
		clear(w.ring[len(ring):])
	}
	w.ring = ring
	if w.cursor >= len(ring) {
		w.cursor, w.granted = 0, false
	}
	if !anyReady {
		return nil, nil, next
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		for range ring {
			g := ring[w.cursor]
			if g.ready != nil {
				if !w.granted {
					g.deficit += quantum * g.weight
					w.granted = true
				}
				if g.deficit > 0 {
					return g.ready, g, next
				}
			}
			w.cursor, w.granted = (w.cursor+1)%len(ring), false
		}
		// A whole round went by and every ready group still owes time:
		// grant the rounds it takes for the least indebted to be owed
		// nothing, at once, instead of going round that many times.
		k := math.Inf(1)
		for _, g := range ring {
			if g.ready != nil {
				k = min(k, math.Ceil(-g.deficit/(quantum*g.weight)))
			}
		}
		if k > 1 {
			for _, g := range ring {
				if g.ready != nil {
					g.deficit += (k - 1) * quantum * g.weight
				}
			}
		}
	}
}
