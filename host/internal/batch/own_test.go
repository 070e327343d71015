package batch_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/sched"
)

// ledger hands out payloads and results as buffers that must be freed
// exactly once, and counts the live ones.
type ledger struct {
	t     *testing.T
	mu    sync.Mutex
	live  map[*buf]bool
	block chan struct{} // when set, Run waits for it (or ctx)
}

type buf struct{ vals []int }

func (l *ledger) alloc(vals []int) *buf {
	b := &buf{vals: vals}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live[b] = true
	return b
}

func (l *ledger) free(b *buf) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.live[b] {
		l.t.Errorf("freed %v twice, or one never allocated", b.vals)
	}
	delete(l.live, b)
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.live)
}

// ops doubles every value; a negative value fails its batch, 999 panics.
func (l *ledger) ops() batch.Ops[*buf, *buf] {
	return batch.Ops[*buf, *buf]{
		Rows: func(b *buf) int { return len(b.vals) },
		Split: func(b *buf, rows []int) ([]*buf, error) {
			var out []*buf
			v := b.vals
			for _, n := range rows {
				out = append(out, l.alloc(v[:n]))
				v = v[n:]
			}
			l.free(b)
			return out, nil
		},
		Run: func(ctx context.Context, reqs []*buf) ([]*buf, error) {
			// A panic leaves the requests to the pool's Drop.
			for _, r := range reqs {
				for _, v := range r.vals {
					if v == 999 {
						panic("999")
					}
				}
			}
			defer func() {
				for _, r := range reqs {
					l.free(r)
				}
			}()
			l.mu.Lock()
			block := l.block
			l.mu.Unlock()
			if block != nil {
				select {
				case <-block:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			out := make([]*buf, len(reqs))
			errs := make(batch.Errors, len(reqs))
			failed := false
			for i, r := range reqs {
				var vals []int
				for _, v := range r.vals {
					if v < 0 {
						errs[i], failed = fmt.Errorf("negative value %d", v), true
					}
					vals = append(vals, 2*v)
				}
				if errs[i] == nil {
					out[i] = l.alloc(vals)
				}
			}
			if failed {
				return out, errs
			}
			return out, nil
		},
		Join: func(parts []*buf) (*buf, error) {
			var vals []int
			for _, p := range parts {
				vals = append(vals, p.vals...)
				l.free(p)
			}
			return l.alloc(vals), nil
		},
		Drop:    l.free,
		Discard: l.free,
	}
}

// TestOwnership drives every way a request can end (success, split,
// refusal, cancellation while queued and while running, a failing
// sibling piece, a panic, a closed pool) and checks that each payload and
// each result is freed exactly once and nothing is left live.
func TestOwnership(t *testing.T) {
	l := &ledger{t: t, live: map[*buf]bool{}}
	w := sched.NewWorker()
	p := batch.NewPool(batch.Limits{MaxBatchSize: 4, MaxWait: time.Millisecond, QueueSize: 8}, l.ops(), nil, w.Notify)
	w.Add(p)
	w.Start(context.Background())
	ctx := context.Background()
	collect := func(what string, out *buf, err error, wantErr bool) {
		t.Helper()
		if (err != nil) != wantErr {
			t.Errorf("%s: err %v, want an error: %v", what, err, wantErr)
		}
		if out != nil {
			l.free(out)
		}
	}

	out, err := p.Submit(ctx, l.alloc([]int{1, 2}))
	collect("plain", out, err, false)
	out, err = p.Submit(ctx, l.alloc([]int{1, 2, 3, 4, 5, 6, 7, 8, 9}))
	collect("split", out, err, false)
	out, err = p.Submit(ctx, l.alloc([]int{1, 2, 3, 4, -5, 6, 7, 8, 9, 10, 11, 12}))
	collect("split with a failing piece", out, err, true)
	out, err = p.Submit(ctx, l.alloc([]int{999}))
	collect("panic", out, err, true)
	out, err = p.Submit(ctx, l.alloc(nil))
	collect("no rows", out, err, true)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	out, err = p.Submit(gone, l.alloc([]int{1}))
	collect("cancelled before", out, err, true)

	// Cancelled while running: the batch's result is abandoned.
	block := make(chan struct{})
	l.mu.Lock()
	l.block = block
	l.mu.Unlock()
	running, cancelRunning := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		out, err := p.Submit(running, l.alloc([]int{1, 2, 3, 4}))
		collect("cancelled while running", out, err, true)
	}()
	waitDepth2(t, p, 0) // taken by the worker
	time.Sleep(5 * time.Millisecond)
	// Queued behind it: eight pieces fill the queue, the next is refused.
	queued, cancelQueued := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := ctx
			if i%2 == 0 {
				c = queued
			}
			out, err := p.Submit(c, l.alloc([]int{1, 2, 3, 4, 5, 6, 7, 8}))
			collect(fmt.Sprintf("queued %d", i), out, err, true)
		}()
	}
	waitDepth2(t, p, 8)
	out, err = p.Submit(ctx, l.alloc([]int{1}))
	if !errors.Is(err, batch.ErrQueueFull) {
		t.Errorf("over the queue: %v, want ErrQueueFull", err)
	}
	collect("queue full", out, err, true)
	cancelQueued()
	waitDepth2(t, p, 4)
	cancelRunning()
	<-done
	p.Close(nil)
	wg.Wait()
	close(block)
	out, err = p.Submit(ctx, l.alloc([]int{1}))
	collect("closed", out, err, true)
	w.Close(ctx)
	if n := l.count(); n != 0 {
		t.Errorf("%d buffers left live", n)
	}
}

func waitDepth2(t *testing.T, p *batch.Pool[*buf, *buf], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.Depth() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pool depth %d, want %d", p.Depth(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
