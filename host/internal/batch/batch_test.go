package batch_test

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

	"go.uber.org/goleak"

	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/sched"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a pool over int rows whose Run doubles every value and
// records the batches it ran. A negative value fails its batch; a value
// of 999 panics.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	block   chan struct{} // when set, Run waits for it (or ctx)
}

func (r *recorder) ops() batch.Ops[[]int, []int] {
	return batch.Ops[[]int, []int]{
		Rows: func(v []int) int { return len(v) },
		Split: func(v []int, rows []int) ([][]int, error) {
			var out [][]int
			for _, n := range rows {
				out = append(out, v[:n])
				v = v[n:]
			}
			return out, nil
		},
		Run: func(ctx context.Context, reqs [][]int) ([][]int, error) {
			var rows []int
			for _, q := range reqs {
				rows = append(rows, q...)
			}
			r.mu.Lock()
			r.batches = append(r.batches, rows)
			block := r.block
			r.mu.Unlock()
			if block != nil {
				select {
				case <-block:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			out := make([][]int, len(reqs))
			for i, q := range reqs {
				for _, v := range q {
					if v < 0 {
						return nil, fmt.Errorf("negative value %d", v)
					}
					if v == 999 {
						panic("999")
					}
					out[i] = append(out[i], 2*v)
				}
			}
			return out, nil
		},
		Join: func(parts [][]int) ([]int, error) { return slices.Concat(parts...), nil },
	}
}

func (r *recorder) sizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []int
	for _, b := range r.batches {
		s = append(s, len(b))
	}
	return s
}

// start makes a pool with a running worker; both stop with the test.
func start(t *testing.T, lim batch.Limits, rec *recorder) *batch.Pool[[]int, []int] {
	t.Helper()
	w := sched.NewWorker()
	p := batch.NewPool(lim, rec.ops(), nil, w.Notify)
	w.Add(p)
	w.Start(context.Background())
	t.Cleanup(func() {
		p.Close(nil)
		w.Close(context.Background())
	})
	return p
}

func submitAsync(p *batch.Pool[[]int, []int], ctx context.Context, v []int) chan result {
	ch := make(chan result, 1)
	go func() {
		out, err := p.Submit(ctx, v)
		ch <- result{out, err}
	}()
	return ch
}

type result struct {
	out []int
	err error
}

// waitDepth waits until the pool holds n pending pieces.
func waitDepth(t *testing.T, p *batch.Pool[[]int, []int], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Depth() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pool depth %d, want %d", p.Depth(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestFlushAtMaxWait(t *testing.T) {
	rec := &recorder{}
	const wait = 50 * time.Millisecond
	p := start(t, batch.Limits{MaxBatchSize: 100, MinBatchSize: 100, MaxWait: wait}, rec)
	begin := time.Now()
	out, err := p.Submit(context.Background(), []int{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(begin); el < wait {
		t.Errorf("flushed after %v, before max_wait %v", el, wait)
	}
	if !slices.Equal(out, []int{2, 4, 6}) || !slices.Equal(rec.sizes(), []int{3}) {
		t.Errorf("got %v in batches %v, want [2 4 6] in one batch of 3", out, rec.sizes())
	}
}

func TestFlushAtMax(t *testing.T) {
	rec := &recorder{}
	p := start(t, batch.Limits{MaxBatchSize: 4, MinBatchSize: 4, MaxWait: time.Hour}, rec)
	var chans []chan result
	for i := range 8 {
		chans = append(chans, submitAsync(p, context.Background(), []int{i}))
	}
	for i, ch := range chans {
		r := <-ch
		if r.err != nil || !slices.Equal(r.out, []int{2 * i}) {
			t.Fatalf("request %d: got %v, %v", i, r.out, r.err)
		}
	}
	if got := rec.sizes(); !slices.Equal(got, []int{4, 4}) {
		t.Errorf("batches %v, want [4 4]", got)
	}
}

func TestSplitsOversizeRequest(t *testing.T) {
	rec := &recorder{}
	p := start(t, batch.Limits{MaxBatchSize: 4, MaxWait: time.Millisecond}, rec)
	in := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	out, err := p.Submit(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]int, len(in))
	for i, v := range in {
		want[i] = 2 * v
	}
	if !slices.Equal(out, want) {
		t.Errorf("got %v, want %v", out, want)
	}
	if got := rec.sizes(); !slices.Equal(got, []int{4, 4, 2}) {
		t.Errorf("batches %v, want [4 4 2]", got)
	}
}

func TestQueueFull(t *testing.T) {
	rec := &recorder{}
	// No worker: nothing drains the queue.
	p := batch.NewPool(batch.Limits{QueueSize: 2}, rec.ops(), nil, func() {})
	defer p.Close(nil)
	a := submitAsync(p, context.Background(), []int{1})
	b := submitAsync(p, context.Background(), []int{2})
	waitDepth(t, p, 2)
	if _, err := p.Submit(context.Background(), []int{3}); !errors.Is(err, batch.ErrQueueFull) {
		t.Fatalf("third request: %v, want ErrQueueFull", err)
	}
	p.Close(nil)
	for _, ch := range []chan result{a, b} {
		if r := <-ch; !errors.Is(r.err, batch.ErrClosed) {
			t.Errorf("queued request after Close: %v, want ErrClosed", r.err)
		}
	}
	if _, err := p.Submit(context.Background(), []int{4}); !errors.Is(err, batch.ErrClosed) {
		t.Errorf("request after Close: %v, want ErrClosed", err)
	}
	// A request split into more pieces than the queue holds is refused
	// whole, at once.
	small := batch.NewPool(batch.Limits{QueueSize: 2, MaxBatchSize: 1}, rec.ops(), nil, func() {})
	defer small.Close(nil)
	if _, err := small.Submit(context.Background(), []int{1, 2, 3}); !errors.Is(err, batch.ErrQueueFull) {
		t.Errorf("request of 3 pieces into a queue of 2: %v, want ErrQueueFull", err)
	}
}

func TestCancelledRequestIsSkipped(t *testing.T) {
	rec := &recorder{}
	w := sched.NewWorker()
	p := batch.NewPool(batch.Limits{MaxWait: time.Millisecond}, rec.ops(), nil, w.Notify)
	w.Add(p)
	ctx, cancel := context.WithCancel(context.Background())
	gone := submitAsync(p, ctx, []int{100, 101})
	waitDepth(t, p, 1)
	cancel()
	if r := <-gone; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled request: %v, want context.Canceled", r.err)
	}
	w.Start(context.Background())
	defer w.Close(context.Background())
	defer p.Close(nil)
	if out, err := p.Submit(context.Background(), []int{7}); err != nil || !slices.Equal(out, []int{14}) {
		t.Fatalf("got %v, %v", out, err)
	}
	if got := rec.sizes(); !slices.Equal(got, []int{1}) {
		t.Errorf("batches %v, want one batch of 1: the cancelled rows must not take batch space", got)
	}
}

func TestCancelInRunningBatchLeavesOthers(t *testing.T) {
	rec := &recorder{block: make(chan struct{})}
	p := start(t, batch.Limits{MaxBatchSize: 8, MinBatchSize: 2, MaxWait: time.Hour}, rec)
	ctx, cancel := context.WithCancel(context.Background())
	a := submitAsync(p, ctx, []int{1})
	b := submitAsync(p, context.Background(), []int{2})
	for len(rec.sizes()) == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if r := <-a; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", r.err)
	}
	close(rec.block)
	if r := <-b; r.err != nil || !slices.Equal(r.out, []int{4}) {
		t.Fatalf("other caller in the batch: %v, %v", r.out, r.err)
	}
}

func TestFailingBatchFailsOnlyItsRequests(t *testing.T) {
	rec := &recorder{}
	p := start(t, batch.Limits{MaxBatchSize: 2, MinBatchSize: 2, MaxWait: time.Hour}, rec)
	bad := submitAsync(p, context.Background(), []int{-1})
	mate := submitAsync(p, context.Background(), []int{5})
	if r := <-bad; r.err == nil || !strings.Contains(r.err.Error(), "negative value -1") {
		t.Fatalf("bad request: %v, %v", r.out, r.err)
	}
	if r := <-mate; r.err == nil {
		t.Fatal("the bad request's batch mate succeeded; the batch failed as a whole")
	}
	panicky := submitAsync(p, context.Background(), []int{999})
	mate2 := submitAsync(p, context.Background(), []int{6})
	for _, ch := range []chan result{panicky, mate2} {
		if r := <-ch; r.err == nil {
			t.Fatal("a request in a panicking batch succeeded")
		}
	}
	// Later batches run as usual.
	c := submitAsync(p, context.Background(), []int{3})
	d := submitAsync(p, context.Background(), []int{4})
	for i, ch := range []chan result{c, d} {
		if r := <-ch; r.err != nil || !slices.Equal(r.out, []int{6 + 2*i}) {
			t.Fatalf("request after the failures: %v, %v", r.out, r.err)
		}
	}
}

func TestShutdownIsBounded(t *testing.T) {
	rec := &recorder{block: make(chan struct{})} // never unblocked
	w := sched.NewWorker()
	p := batch.NewPool(batch.Limits{MaxBatchSize: 1, MaxWait: time.Millisecond}, rec.ops(), nil, w.Notify)
	w.Add(p)
	w.Start(context.Background())
	running := submitAsync(p, context.Background(), []int{1})
	for len(rec.sizes()) == 0 {
		time.Sleep(time.Millisecond)
	}
	queued := submitAsync(p, context.Background(), []int{2})
	waitDepth(t, p, 1)

	begin := time.Now()
	p.Close(nil)
	if r := <-queued; !errors.Is(r.err, batch.ErrClosed) {
		t.Errorf("queued request: %v, want ErrClosed", r.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	w.Close(ctx)
	if r := <-running; !errors.Is(r.err, context.Canceled) {
		t.Errorf("running request after a shutdown past its deadline: %v, want context.Canceled", r.err)
	}
	if el := time.Since(begin); el > 5*time.Second {
		t.Errorf("shutdown took %v", el)
	}
}

func TestOldestPoolFirst(t *testing.T) {
	var mu sync.Mutex
	var order []string
	w := sched.NewWorker()
	var pools []*batch.Pool[[]int, []int]
	for _, name := range []string{"a", "b", "c"} {
		rec := &recorder{}
		ops := rec.ops()
		run := ops.Run
		ops.Run = func(ctx context.Context, reqs [][]int) ([][]int, error) {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			return run(ctx, reqs)
		}
		p := batch.NewPool(batch.Limits{MaxBatchSize: 1, MaxWait: time.Millisecond}, ops, nil, w.Notify)
		w.Add(p)
		pools = append(pools, p)
	}
	// Queue into c, then a, then b, while the worker is stopped.
	var chans []chan result
	for _, i := range []int{2, 0, 1} {
		chans = append(chans, submitAsync(pools[i], context.Background(), []int{i}))
		waitDepth(t, pools[i], 1)
		time.Sleep(2 * time.Millisecond) // distinct enqueue times
	}
	w.Start(context.Background())
	for _, ch := range chans {
		if r := <-ch; r.err != nil {
			t.Fatal(r.err)
		}
	}
	for _, p := range pools {
		p.Close(nil)
	}
	w.Close(context.Background())
	if got := fmt.Sprint(order); got != "[c a b]" {
		t.Errorf("ran pools in order %s, want [c a b] (oldest request first)", got)
	}
}

// TestErrorsFailRequestsOneByOne checks a Run that returns batch.Errors:
// each request gets its own error or its own result, including the pieces
// of a split request, which fails if any piece does.
func TestErrorsFailRequestsOneByOne(t *testing.T) {
	errOdd := errors.New("odd request")
	w := sched.NewWorker()
	ops := batch.Ops[[]int, []int]{
		Rows:  func(v []int) int { return len(v) },
		Split: (&recorder{}).ops().Split,
		Join:  func(parts [][]int) ([]int, error) { return slices.Concat(parts...), nil },
		// A request whose first value is odd fails alone.
		Run: func(_ context.Context, reqs [][]int) ([][]int, error) {
			out := make([][]int, len(reqs))
			errs := make(batch.Errors, len(reqs))
			for i, q := range reqs {
				if q[0]%2 != 0 {
					errs[i] = fmt.Errorf("%w: %d", errOdd, q[0])
					continue
				}
				out[i] = []int{-q[0]}
			}
			return out, errs
		},
	}
	p := batch.NewPool(batch.Limits{MinBatchSize: 5, MaxWait: time.Minute}, ops, nil, w.Notify)
	w.Add(p)
	w.Start(context.Background())
	defer func() {
		p.Close(nil)
		w.Close(context.Background())
	}()
	tests := []struct {
		name    string
		in      []int
		want    []int
		wantErr bool
	}{
		{"even", []int{2}, []int{-2}, false},
		{"odd", []int{3}, nil, true},
		{"even too", []int{4}, []int{-4}, false},
		{"another odd", []int{7}, nil, true},
		{"zero", []int{0}, []int{0}, false},
	}
	chans := make([]chan result, len(tests))
	for i, tt := range tests {
		chans[i] = submitAsync(p, context.Background(), tt.in)
	}
	for i, tt := range tests {
		r := <-chans[i]
		if tt.wantErr {
			if !errors.Is(r.err, errOdd) || !strings.Contains(r.err.Error(), fmt.Sprint(tt.in[0])) {
				t.Errorf("%s: %v, %v; want its own error", tt.name, r.out, r.err)
			}
			continue
		}
		if r.err != nil || !slices.Equal(r.out, tt.want) {
			t.Errorf("%s: %v, %v; want %v", tt.name, r.out, r.err, tt.want)
		}
	}
}

// slowObserver counts batches, taking its time over each, as a busy
// metrics path may.
type slowObserver struct{ batches atomic.Int64 }

func (o *slowObserver) Batch(int, []time.Duration, time.Duration, error) {
	time.Sleep(20 * time.Millisecond)
	o.batches.Add(1)
}
func (o *slowObserver) Queue(int) {}

// TestBatchObservedBeforeAnswers checks that a caller that has its answer
// finds its batch in the pool's stats: the observer hears of the batch
// before the answers go out.
func TestBatchObservedBeforeAnswers(t *testing.T) {
	var rec recorder
	obs := &slowObserver{}
	w := sched.NewWorker()
	p := batch.NewPool(batch.Limits{}, rec.ops(), obs, w.Notify)
	w.Add(p)
	w.Start(context.Background())
	defer func() {
		p.Close(nil)
		w.Close(context.Background())
	}()
	for i := range 3 {
		if _, err := p.Submit(context.Background(), []int{i}); err != nil {
			t.Fatal(err)
		}
		if got := obs.batches.Load(); got != int64(i+1) {
			t.Fatalf("after answer %d the observer has seen %d batches", i+1, got)
		}
	}
}

// depthObserver keeps the last depth reported, and takes its time over the
// first report, as a descheduled caller may.
type depthObserver struct {
	mu    sync.Mutex
	calls int
	last  int
}

func (o *depthObserver) Batch(int, []time.Duration, time.Duration, error) {}
func (o *depthObserver) Queue(depth int) {
	o.mu.Lock()
	o.calls++
	first := o.calls == 1
	o.mu.Unlock()
	if first {
		time.Sleep(50 * time.Millisecond)
	}
	o.mu.Lock()
	o.last = depth
	o.mu.Unlock()
}

// TestQueueDepthReportsInOrder checks that the last depth reported is the
// pool's: three requests queue at once while the first report is slow,
// and the gauge must end at 3, not at the first report's 1 that arrived
// last.
func TestQueueDepthReportsInOrder(t *testing.T) {
	var rec recorder
	obs := &depthObserver{}
	w := sched.NewWorker()
	p := batch.NewPool(batch.Limits{MinBatchSize: 100, MaxWait: time.Minute}, rec.ops(), obs, w.Notify)
	w.Add(p)
	w.Start(context.Background())
	defer func() {
		p.Close(nil)
		w.Close(context.Background())
	}()
	ctx, cancel := context.WithCancel(context.Background())
	var chans []chan result
	chans = append(chans, submitAsync(p, ctx, []int{0}))
	for obs.reported() == 0 {
		time.Sleep(time.Millisecond) // the first report is under way
	}
	for i := 1; i < 3; i++ {
		chans = append(chans, submitAsync(p, ctx, []int{i}))
	}
	waitDepth(t, p, 3)
	time.Sleep(100 * time.Millisecond) // the slow first report is over
	obs.mu.Lock()
	last := obs.last
	obs.mu.Unlock()
	if last != 3 {
		t.Errorf("the observer's last depth is %d, want the pool's 3", last)
	}
	cancel()
	for _, ch := range chans {
		<-ch
	}
}

func (o *depthObserver) reported() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.calls
}
