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
// A batch holds the device only while it uses it. Each batch runs in a
// goroutine of its own with a [Lease] in its context; the sandbox calls
// Leave when control passes to guest code and Enter when it comes back
// (a host function that runs kernels, or the export's return). A batch
// that stays in guest code for offSlice (a guest that spins, or sleeps in
// a WASI call) is detached: the worker runs other groups' batches, and
// the detached batch's next Enter waits for its group's turn like a new
// batch. So another pool waits behind a batch for at most one kernel
// step (the host function that runs when the turn passes) or about
// 2 × offSlice, whatever the guest does. Each pool has at most one batch
// in flight, and each group at most maxInFlight, detached or not: one
// guest that spins holds up neither its own group's other pools (the
// operator's experts all share one group) nor another group's, and one
// tenant's guests take at most maxInFlight cores of guest code at a time.
//
// Between kernel steps, turns are not preemptive. A group that gets work
// waits for the batch that holds the device and, at most, for one turn of
// each group ahead of it in the round; a turn is one batch when batches
// run past the quantum (1 ms × weight). With two tenants, one's wait is
// bounded by one batch of the other.
//
// A failing batch fails only its own requests; the worker carries on.
package sched

import (
	"context"
	"fmt"
	"math"
	goruntime "runtime"
	"slices"
	"sync"
	"sync/atomic"
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
	resume  *Lease    // its detached batch, asking for the device back

	// inFlight counts the group's batches in flight (holding the device
	// or detached); at maxInFlight the group starts no other.
	inFlight atomic.Int32
}

// maxInFlight is how many batches of one group may be in flight at once.
// One batch holds the device at a time, so the others are detached (in
// guest code): with two, a guest that spins until its call timeout leaves
// its group's other pools served, and a tenant that spins in several
// experts at once burns at most two cores of guest code until the first
// call timeout quarantines it.
const maxInFlight = 2

type entry struct {
	p Pool
	g *group
	// running is true while a batch of p is in flight: the worker
	// starts no other of p.
	running *atomic.Bool
}

// Worker runs the batches of a set of pools, one at a time.
type Worker struct {
	wake chan struct{}
	now  func() time.Time // time.Now; tests swap in a fake clock

	mu       sync.Mutex
	pools    []entry // copied on write: pick reads a snapshot
	groups   map[string]*group
	inflight map[Pool]*Lease // batches running, holding the device or detached
	resumes  []*Lease        // detached batches asking for the device back
	closed   bool            // the loop has stopped: Enter no longer waits
	ended    *sync.Cond      // broadcast when a batch ends

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
		wake:     make(chan struct{}, 1),
		now:      time.Now,
		groups:   make(map[string]*group),
		inflight: make(map[Pool]*Lease),
		quit:     make(chan struct{}),
		stopped:  make(chan struct{}),
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
	w.pools = append(pools, entry{p: p, g: g, running: new(atomic.Bool)})
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
	for p != nil && w.inflight[p] != nil {
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
// every batch's context; its cancellation does not stop the worker. It
// never fails: the error is there for the house lifecycle,
// Start(ctx) error and Close(ctx) error.
func (w *Worker) Start(ctx context.Context) error {
	ctx, w.abort = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(w.stopped)
		w.loop(ctx)
	}()
	return nil
}

// Close stops the worker once the batches in flight, if any, end, and
// waits for them. If ctx ends first, they are cancelled, and Close
// returns ctx's error once they have stopped; otherwise nil. Pending
// requests stay in their pools; close those first. Closing a worker that
// never started does nothing.
func (w *Worker) Close(ctx context.Context) error {
	if w.abort == nil {
		return nil
	}
	w.once.Do(func() { close(w.quit) })
	drained := make(chan struct{})
	go func() {
		<-w.stopped
		w.mu.Lock()
		for len(w.inflight) > 0 {
			w.ended.Wait()
		}
		w.mu.Unlock()
		close(drained)
	}()
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		w.abort()
		<-drained
		err = fmt.Errorf("sched: batches cancelled at close: %w", ctx.Err())
	}
	w.abort()
	return err
}

func (w *Worker) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	defer w.release()
	for {
		select {
		case <-w.quit:
			return
		default:
		}
		p, g, next := w.pick(w.now())
		if p != nil || g != nil && g.resume != nil {
			w.run(ctx, p, g, timer)
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

// release lets every detached batch go on without the device once the
// loop has stopped, so that Close can wait for them to end.
func (w *Worker) release() {
	w.mu.Lock()
	w.closed = true
	resumes := w.resumes
	w.resumes = nil
	w.mu.Unlock()
	for _, l := range resumes {
		l.grant()
	}
}

// run starts a batch of p, unless p was removed since pick, or hands the
// device back to g's detached batch when p is nil; it returns when the
// batch ends or is detached, and charges the time it held the device to g.
// timer is the loop's, which hold borrows.
func (w *Worker) run(ctx context.Context, p Pool, g *group, timer *time.Timer) {
	// Read the clock before the batch can start: its goroutine may run
	// (and, on a test's fake clock, advance it) before this one goes on,
	// and a batch charged nothing would keep its group's turn.
	start := w.now()
	var l *Lease
	if p == nil {
		l = g.resume
		w.mu.Lock()
		w.resumes = slices.DeleteFunc(w.resumes, func(r *Lease) bool { return r == l })
		w.mu.Unlock()
		l.grant()
	} else {
		w.mu.Lock()
		i := slices.IndexFunc(w.pools, func(e entry) bool { return e.p == p })
		if i < 0 { // removed since pick
			w.mu.Unlock()
			return
		}
		l = &Lease{w: w, g: g, done: make(chan struct{})}
		w.inflight[p] = l
		g.inFlight.Add(1)
		running := w.pools[i].running
		running.Store(true)
		w.mu.Unlock()
		go w.batch(ctx, p, l, running)
	}
	w.hold(l, timer)
	g.deficit -= float64(w.now().Sub(start))
}

// batch runs one batch of p in its own goroutine, with l in its context.
func (w *Worker) batch(ctx context.Context, p Pool, l *Lease, running *atomic.Bool) {
	p.RunBatch(context.WithValue(ctx, leaseKey{}, l))
	// The batch's callers were woken on this goroutine's P, where Go
	// queues them to run next; but the next batch would keep the P, and
	// with every other P in its kernels they waited for the OS to
	// schedule another thread: 2-4 ms on 2 cores, twice a tenant's whole
	// wait (make test-fairness). Yielding lets them return first.
	goruntime.Gosched()
	w.mu.Lock()
	delete(w.inflight, p)
	l.g.inFlight.Add(-1)
	running.Store(false)
	w.ended.Broadcast()
	w.mu.Unlock()
	close(l.done)
	w.Notify()
}

// offSlice is how long a batch may stay in guest code, holding the
// device, before the worker detaches it. Honest guests spend microseconds
// between host calls; the worker looks every offSlice, so a spinning or
// sleeping guest holds the device for at most about twice this.
const offSlice = 5 * time.Millisecond

// hold waits until l's batch ends, or detaches it once it has stayed in
// guest code for offSlice. It uses timer (the loop's: one per worker, not
// one per batch) and leaves it stopped.
func (w *Worker) hold(l *Lease, timer *time.Timer) {
	timer.Reset(offSlice)
	defer timer.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-timer.C:
		}
		l.mu.Lock()
		wait := offSlice
		if l.off {
			away := time.Since(l.offSince)
			if away >= offSlice {
				l.detached = true
				l.mu.Unlock()
				return
			}
			wait = offSlice - away
		}
		l.mu.Unlock()
		timer.Reset(wait)
	}
}

// Lease is a running batch's hold on its worker's device, found in the
// batch's context with LeaseFrom. The code that runs the batch calls
// Leave before it runs code that does not use the device (a guest's own
// code) and Enter after, before it uses the device again.
type Lease struct {
	w    *Worker
	g    *group
	done chan struct{} // closed when the batch ends

	mu       sync.Mutex
	off      bool          // between Leave and Enter
	offSince time.Time     // when Leave was called
	detached bool          // the worker took the device back while off
	resume   chan struct{} // closed by grant when the device comes back
}

type leaseKey struct{}

// LeaseFrom returns the lease of the batch whose context ctx is, or nil.
// The methods of a nil *Lease do nothing.
func LeaseFrom(ctx context.Context) *Lease {
	l, _ := ctx.Value(leaseKey{}).(*Lease)
	return l
}

// Leave marks the start of code that does not use the device: the worker
// may give the device to another batch if the code runs for offSlice.
func (l *Lease) Leave() {
	if l == nil {
		return
	}
	l.mu.Lock()
	if !l.off {
		l.off, l.offSince = true, time.Now()
	}
	l.mu.Unlock()
}

// Enter marks the end of code that Leave began. If the worker gave the
// device away meanwhile, Enter waits for the batch's group's next turn.
func (l *Lease) Enter() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.off = false
	if !l.detached {
		l.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	l.resume = ch
	l.mu.Unlock()
	w := l.w
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		l.grant()
	} else {
		w.resumes = append(w.resumes, l)
		w.mu.Unlock()
		w.Notify()
	}
	<-ch
}

// grant gives the device back to a detached batch waiting in Enter.
func (l *Lease) grant() {
	l.mu.Lock()
	l.detached = false
	ch := l.resume
	l.resume = nil
	l.mu.Unlock()
	if ch != nil {
		close(ch)
	}
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
	resumes := slices.Clone(w.resumes)
	w.mu.Unlock()

	w.epoch++
	var next time.Time
	anyReady := false
	mark := func(g *group) {
		if g.mark != w.epoch {
			g.mark, g.pending, g.ready, g.resume = w.epoch, false, nil, nil
		}
	}
	for _, l := range resumes {
		g := l.g
		mark(g)
		if g.resume == nil { // the one that asked first
			g.pending, g.resume = true, l
		}
		anyReady = true
	}
	for _, e := range pools {
		g := e.g
		mark(g)
		oldest, readyAt, ok := e.p.Poll()
		if !ok {
			continue
		}
		g.pending = true
		if g.inFlight.Load() >= maxInFlight {
			// One of its batches in flight finishes first (or
			// asks to resume, above).
			continue
		}
		if e.running.Load() {
			// Its own batch in flight is detached: it finishes
			// first.
			continue
		}
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
	for _, l := range resumes {
		if g := l.g; !g.active {
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
			if g.ready != nil || g.resume != nil {
				if !w.granted {
					g.deficit += quantum * g.weight
					w.granted = true
				}
				if g.deficit > 0 {
					if g.resume != nil {
						return nil, g, next
					}
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
			if g.ready != nil || g.resume != nil {
				k = min(k, math.Ceil(-g.deficit/(quantum*g.weight)))
			}
		}
		if k > 1 {
			for _, g := range ring {
				if g.ready != nil || g.resume != nil {
					g.deficit += (k - 1) * quantum * g.weight
				}
			}
		}
	}
}
