package sched_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/sched"
)

// clock is a fake clock that only batches move.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }
func newClock() *clock                   { c := &clock{}; c.ns.Store(int64(time.Hour)); return c }

// recorder logs the batches that ran and stops every pool after limit.
type recorder struct {
	mu    sync.Mutex
	log   []string
	busy  map[string]time.Duration // run time per group
	limit int
	done  chan struct{}
	hook  func(n int) // called after the nth batch, on the worker
}

func newRecorder(limit int) *recorder {
	return &recorder{busy: map[string]time.Duration{}, limit: limit, done: make(chan struct{})}
}

func (r *recorder) finished() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.log) >= r.limit
}

func (r *recorder) ran(pool, group string, d time.Duration) {
	r.mu.Lock()
	if len(r.log) >= r.limit {
		r.mu.Unlock()
		return
	}
	r.log = append(r.log, pool)
	r.busy[group] += d
	n := len(r.log)
	if n == r.limit {
		close(r.done)
	}
	r.mu.Unlock()
	if r.hook != nil {
		r.hook(n)
	}
}

// pool is a fake pool whose batches cost a fixed time on the fake clock.
// With backlog it always has a request, enqueued when its last batch
// ended; otherwise it serves queue, one request per batch.
type pool struct {
	name, group string
	cost        time.Duration
	clk         *clock
	rec         *recorder

	mu      sync.Mutex
	backlog bool
	last    time.Time
	queue   []time.Time
}

func (p *pool) Poll() (time.Time, time.Time, bool) {
	if p.rec.finished() {
		return time.Time{}, time.Time{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.backlog {
		return p.last, time.Time{}, true
	}
	if len(p.queue) == 0 {
		return time.Time{}, time.Time{}, false
	}
	return p.queue[0], time.Time{}, true
}

func (p *pool) RunBatch(context.Context) {
	p.clk.advance(p.cost)
	p.mu.Lock()
	p.last = p.clk.now()
	if !p.backlog && len(p.queue) > 0 {
		p.queue = p.queue[1:]
	}
	p.mu.Unlock()
	p.rec.ran(p.name, p.group, p.cost)
}

func run(t *testing.T, w *sched.Worker, rec *recorder) {
	t.Helper()
	w.Start(context.Background())
	defer w.Close(context.Background())
	select {
	case <-rec.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("only %d of %d batches ran", len(rec.log), rec.limit)
	}
}

// TestShares checks that backlogged groups share run time by weight,
// however many pools each has and whatever their batches cost.
func TestShares(t *testing.T) {
	t.Parallel()
	type spec struct {
		group  string
		weight float64 // 0: no WithGroup (the operator)
		pools  int
		cost   time.Duration
	}
	for _, tt := range []struct {
		name  string
		specs []spec
		want  map[string]float64 // share of run time
	}{
		{"many pools vs one", []spec{{"a", 1, 8, 3 * time.Millisecond}, {"b", 1, 1, time.Millisecond}},
			map[string]float64{"a": 0.5, "b": 0.5}},
		{"weights 1:3", []spec{{"a", 1, 2, 2 * time.Millisecond}, {"b", 3, 1, 2 * time.Millisecond}},
			map[string]float64{"a": 0.25, "b": 0.75}},
		{"operator and two tenants", []spec{{"", 0, 3, 5 * time.Millisecond}, {"a", 1, 1, 500 * time.Microsecond}, {"b", 2, 4, 7 * time.Millisecond}},
			map[string]float64{"": 0.25, "a": 0.25, "b": 0.5}},
		{"batches far past the quantum", []spec{{"a", 1, 4, 50 * time.Millisecond}, {"b", 1, 1, 10 * time.Millisecond}},
			map[string]float64{"a": 0.5, "b": 0.5}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk, rec := newClock(), newRecorder(2000)
			w := sched.NewWorker()
			sched.SetClock(w, clk.now)
			for _, s := range tt.specs {
				for i := range s.pools {
					p := &pool{name: fmt.Sprintf("%s%d", s.group, i), group: s.group, cost: s.cost, clk: clk, rec: rec, backlog: true}
					if s.weight == 0 {
						w.Add(p)
					} else {
						w.Add(p, sched.WithGroup(s.group, s.weight))
					}
				}
			}
			run(t, w, rec)
			var total time.Duration
			for _, d := range rec.busy {
				total += d
			}
			for g, want := range tt.want {
				got := float64(rec.busy[g]) / float64(total)
				t.Logf("group %q: %.3f of run time (want %.3f)", g, got, want)
				if got < want*0.95 || got > want*1.05 {
					t.Errorf("group %q got %.3f of run time, want %.3f ± 5%%", g, got, want)
				}
			}
		})
	}
}

// TestOldestFirstWithinGroup checks that a group's ready pools run oldest
// request first.
func TestOldestFirstWithinGroup(t *testing.T) {
	t.Parallel()
	clk, rec := newClock(), newRecorder(6)
	w := sched.NewWorker()
	sched.SetClock(w, clk.now)
	at := func(s ...int) []time.Time {
		var ts []time.Time
		for _, x := range s {
			ts = append(ts, time.Unix(int64(x), 0))
		}
		return ts
	}
	for _, p := range []*pool{
		{name: "p1", queue: at(3, 6)},
		{name: "p2", queue: at(1, 5)},
		{name: "p3", queue: at(2, 4)},
	} {
		p.group, p.cost, p.clk, p.rec = "a", time.Millisecond, clk, rec
		w.Add(p, sched.WithGroup("a", 1))
	}
	run(t, w, rec)
	if got, want := strings.Join(rec.log, " "), "p2 p3 p1 p3 p2 p1"; got != want {
		t.Errorf("order %q, want %q", got, want)
	}
}

// TestIdleGroupBanksNoCredit checks that a group that was idle while
// another ran gets its share from the moment it has work, not a burst to
// make up for the time it did not use.
func TestIdleGroupBanksNoCredit(t *testing.T) {
	t.Parallel()
	clk, rec := newClock(), newRecorder(400)
	w := sched.NewWorker()
	sched.SetClock(w, clk.now)
	a := &pool{name: "a", group: "a", cost: time.Millisecond, clk: clk, rec: rec, backlog: true}
	b := &pool{name: "b", group: "b", cost: time.Millisecond, clk: clk, rec: rec}
	// a runs alone for 100 batches, then b gets a backlog.
	rec.hook = func(n int) {
		if n == 100 {
			b.mu.Lock()
			b.backlog, b.last = true, clk.now()
			b.mu.Unlock()
		}
	}
	w.Add(a, sched.WithGroup("a", 1))
	w.Add(b, sched.WithGroup("b", 1))
	run(t, w, rec)
	// From b's first batch on, no group runs more than twice in a row.
	log := strings.Join(rec.log, "")
	first := strings.Index(log, "b")
	if first < 0 {
		t.Fatal("b never ran")
	}
	if first > 101 {
		t.Errorf("b first ran at batch %d, want it within one batch of getting work (100)", first)
	}
	rest := log[first : len(log)-2] // the very end may stop mid-turn
	if strings.Contains(rest, "bbb") || strings.Contains(rest, "aaa") {
		t.Errorf("turns after b woke are not alternating: %s", rest)
	}
}

// blockPool's batches block until released.
type blockPool struct {
	started chan struct{}
	release chan struct{}
	runs    atomic.Int64
}

func (p *blockPool) Poll() (time.Time, time.Time, bool) { return time.Time{}, time.Time{}, true }
func (p *blockPool) RunBatch(context.Context) {
	p.runs.Add(1)
	select {
	case p.started <- struct{}{}:
	default:
	}
	<-p.release
}

// TestRemoveWhileRunning checks that Remove lets a running batch end,
// returns only then, and that the pool never runs again while others do.
func TestRemoveWhileRunning(t *testing.T) {
	t.Parallel()
	w := sched.NewWorker()
	p := &blockPool{started: make(chan struct{}, 1), release: make(chan struct{})}
	other := &blockPool{started: make(chan struct{}, 100), release: make(chan struct{})}
	close(other.release)
	w.Add(p, sched.WithGroup("t", 1))
	w.Start(context.Background())
	defer w.Close(context.Background())
	var once sync.Once
	release := func() { once.Do(func() { close(p.release) }) }
	defer release()
	<-p.started

	removed := make(chan struct{})
	go func() { w.Remove(p); close(removed) }()
	select {
	case <-removed:
		t.Fatal("Remove returned while the pool's batch was running")
	case <-time.After(50 * time.Millisecond):
	}
	w.Add(other)
	release()
	select {
	case <-removed:
	case <-time.After(10 * time.Second):
		t.Fatal("Remove did not return after the batch ended")
	}
	n := p.runs.Load()
	for range 20 {
		<-other.started
	}
	if got := p.runs.Load(); got != n {
		t.Errorf("removed pool ran %d more batches", got-n)
	}
	// Removing a pool that is not running, or was never added, returns.
	w.Remove(other)
	w.Remove(p)
}

// TestAddRemoveHammer adds and removes pools of many groups while the
// worker runs them (run with -race).
func TestAddRemoveHammer(t *testing.T) {
	t.Parallel()
	w := sched.NewWorker()
	w.Start(context.Background())
	defer w.Close(context.Background())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p := &blockPool{started: make(chan struct{}, 1000), release: make(chan struct{})}
				close(p.release)
				w.Add(p, sched.WithGroup(fmt.Sprint(g), float64(i%3)))
				w.Remove(p)
				w.Remove(p)
			}
		}()
	}
	wg.Wait()
	keep := &blockPool{started: make(chan struct{}, 1), release: make(chan struct{})}
	close(keep.release)
	w.Add(keep)
	select {
	case <-keep.started:
	case <-time.After(10 * time.Second):
		t.Fatal("worker stopped serving after the hammer")
	}
}

// nopPool is always ready and its batches do nothing.
type nopPool struct{ n *atomic.Int64 }

func (p nopPool) Poll() (time.Time, time.Time, bool) { return time.Time{}, time.Time{}, true }
func (p nopPool) RunBatch(context.Context)           { p.n.Add(1) }

// BenchmarkSchedule measures the worker's cost per batch (polling every
// pool and the round robin) with 256 pools, in one group (oldest-first
// only, as before groups) and in 32 groups.
func BenchmarkSchedule(b *testing.B) {
	for _, groups := range []int{1, 32} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			w := sched.NewWorker()
			var n atomic.Int64
			for i := range 256 {
				w.Add(&nopPool{&n}, sched.WithGroup(fmt.Sprint(i%groups), float64(1+i%3)))
			}
			b.ResetTimer()
			w.Start(context.Background())
			for n.Load() < int64(b.N) {
				time.Sleep(time.Millisecond)
			}
			b.StopTimer()
			w.Close(context.Background())
		})
	}
}

// TestWaitBound: while tenant a floods with 8 busy experts, tenant b sends
// one request at a time, arriving while one of a's batches runs; b
// waits at most for that batch.
func TestWaitBound(t *testing.T) {
	t.Parallel()
	const aCost = 10 * time.Millisecond
	clk, rec := newClock(), newRecorder(600)
	w := sched.NewWorker()
	sched.SetClock(w, clk.now)
	b := &pool{name: "b", group: "b", cost: time.Millisecond, clk: clk, rec: rec}
	var waits []time.Duration
	rec.hook = func(n int) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if n%5 == 0 && len(b.queue) == 0 {
			b.queue = append(b.queue, clk.now().Add(-aCost/2)) // it came during that batch
		}
	}
	bRun := &waitPool{pool: b, waits: &waits}
	for i := range 8 {
		w.Add(&pool{name: fmt.Sprint("a", i), group: "a", cost: aCost, clk: clk, rec: rec, backlog: true}, sched.WithGroup("a", 1))
	}
	w.Add(bRun, sched.WithGroup("b", 1))
	run(t, w, rec)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(waits) < 50 {
		t.Fatalf("b ran %d times", len(waits))
	}
	worst := slices.Max(waits)
	t.Logf("b ran %d requests; worst wait %v, a's batch %v", len(waits), worst, aCost)
	if worst > aCost {
		t.Errorf("b waited %v, more than one of a's batches (%v)", worst, aCost)
	}
}

// waitPool records how long each request of its pool waited to run.
type waitPool struct {
	*pool
	waits *[]time.Duration
}

func (p *waitPool) RunBatch(ctx context.Context) {
	p.mu.Lock()
	if len(p.queue) > 0 {
		p.rec.mu.Lock()
		*p.waits = append(*p.waits, p.clk.now().Sub(p.queue[0]))
		p.rec.mu.Unlock()
	}
	p.mu.Unlock()
	p.pool.RunBatch(ctx)
}

// ctxPool's batches run until their context ends.
type ctxPool struct{ started chan struct{} }

func (p *ctxPool) Poll() (time.Time, time.Time, bool) { return time.Time{}, time.Time{}, true }
func (p *ctxPool) RunBatch(ctx context.Context) {
	select {
	case p.started <- struct{}{}:
	default:
	}
	<-ctx.Done()
}

// TestCloseReportsCancelledBatches checks that Close cancels a batch
// still running when its context ends and says so, and that a worker
// whose batches ended closes with nil.
func TestCloseReportsCancelledBatches(t *testing.T) {
	t.Parallel()
	w := sched.NewWorker()
	if err := w.Close(context.Background()); err != nil {
		t.Errorf("Close before Start = %v, want nil", err)
	}
	p := &ctxPool{started: make(chan struct{}, 1)}
	w.Add(p)
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-p.started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with a batch running past its deadline = %v, want DeadlineExceeded", err)
	}

	idle := sched.NewWorker()
	if err := idle.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := idle.Close(context.Background()); err != nil {
		t.Errorf("Close of an idle worker = %v, want nil", err)
	}
}
