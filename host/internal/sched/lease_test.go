package sched_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moehost/moehost/host/internal/sched"
)

// guestPool's batches leave the device for guest code that runs for
// guest (a spinning or sleeping guest), then use the device again.
type guestPool struct {
	guest   time.Duration
	pending atomic.Int64
	mu      sync.Mutex
	ends    []time.Time
	// onDevice is set while a batch holds the device (between Enter
	// and Leave, and at the start and end of the batch).
	onDevice *atomic.Int64
	overlap  *atomic.Int64
	// inGuest, if set, counts the batches in guest code across pools,
	// and worstInGuest keeps its maximum.
	inGuest, worstInGuest *atomic.Int64
	// runs counts the pool's batches in flight; twice, the times a
	// batch started while another of the pool's ran.
	runs, twice atomic.Int64
}

func (p *guestPool) Poll() (time.Time, time.Time, bool) {
	return time.Time{}, time.Time{}, p.pending.Load() > 0
}

func (p *guestPool) RunBatch(ctx context.Context) {
	p.pending.Add(-1)
	if p.runs.Add(1) > 1 {
		p.twice.Add(1)
	}
	defer p.runs.Add(-1)
	l := sched.LeaseFrom(ctx)
	if l == nil {
		panic("no lease in the batch's context")
	}
	p.device(time.Millisecond)
	l.Leave()
	if p.inGuest != nil {
		n := p.inGuest.Add(1)
		for w := p.worstInGuest.Load(); n > w && !p.worstInGuest.CompareAndSwap(w, n); w = p.worstInGuest.Load() {
		}
		defer p.inGuest.Add(-1) // after the last kernel step: still in flight
	}
	time.Sleep(p.guest)
	l.Enter()
	p.device(time.Millisecond)
	p.mu.Lock()
	p.ends = append(p.ends, time.Now())
	p.mu.Unlock()
}

// device stands for a kernel step of d, and counts batches that ran one
// at the same time.
func (p *guestPool) device(d time.Duration) {
	if p.onDevice.Add(1) > 1 {
		p.overlap.Add(1)
	}
	time.Sleep(d)
	p.onDevice.Add(-1)
}

// TestGuestCodeDoesNotHoldTheDevice: a batch whose guest runs for a
// second between kernel steps is detached, and another pool's batches run
// meanwhile, each within a few milliseconds, whether the pool is another
// tenant's or the same owner's (the operator's experts share one group);
// kernel steps never overlap, and the detached batch ends once it gets
// the device back.
func TestGuestCodeDoesNotHoldTheDevice(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ name, spinner, other string }{
		{"another tenant's pool", "mallory", "alice"},
		{"the same owner's pool", "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var onDevice, overlap atomic.Int64
			spin := &guestPool{guest: time.Second, onDevice: &onDevice, overlap: &overlap}
			good := &guestPool{onDevice: &onDevice, overlap: &overlap}
			w := sched.NewWorker()
			w.Add(spin, sched.WithGroup(tt.spinner, 1))
			w.Add(good, sched.WithGroup(tt.other, 1))
			w.Start(context.Background())
			defer w.Close(context.Background())

			spin.pending.Add(1)
			w.Notify()
			time.Sleep(50 * time.Millisecond) // the guest is spinning
			var worst time.Duration
			for range 20 {
				start := time.Now()
				good.pending.Add(1)
				w.Notify()
				for good.pending.Load() > 0 || len(good.ended()) == 0 || good.ended()[len(good.ended())-1].Before(start) {
					time.Sleep(100 * time.Microsecond)
				}
				worst = max(worst, time.Since(start))
			}
			t.Logf("the other pool's worst batch behind a guest that spins for 1 s: %v", worst)
			if worst > 100*time.Millisecond {
				t.Errorf("the other pool waited %v behind a spinning guest; the bound is 100 ms", worst)
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(spin.ended()) == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if len(spin.ended()) == 0 {
				t.Fatal("the detached batch never got the device back")
			}
			if n := overlap.Load(); n > 0 {
				t.Errorf("kernel steps of two batches overlapped %d times", n)
			}
		})
	}
}

// TestGroupGuestCodeIsBounded: a tenant whose three experts all spin has
// at most two batches in flight (two cores of guest code), and each
// expert at most one; the third waits for a spinner to end, while
// another tenant is served.
func TestGroupGuestCodeIsBounded(t *testing.T) {
	t.Parallel()
	var onDevice, overlap, inGuest, worstInGuest atomic.Int64
	w := sched.NewWorker()
	var spinners []*guestPool
	for range 3 {
		p := &guestPool{guest: 200 * time.Millisecond, onDevice: &onDevice, overlap: &overlap, inGuest: &inGuest, worstInGuest: &worstInGuest}
		p.pending.Add(2)
		spinners = append(spinners, p)
		w.Add(p, sched.WithGroup("mallory", 1))
	}
	good := &guestPool{onDevice: &onDevice, overlap: &overlap}
	w.Add(good, sched.WithGroup("alice", 1))
	w.Start(context.Background())
	defer w.Close(context.Background())
	time.Sleep(50 * time.Millisecond)
	good.pending.Add(1)
	w.Notify()
	deadline := time.Now().Add(5 * time.Second)
	for len(good.ended()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if len(good.ended()) == 0 {
		t.Error("alice was not served beside mallory's spinning guests")
	}
	for _, p := range spinners {
		for len(p.ended()) < 2 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if n := len(p.ended()); n < 2 {
			t.Fatalf("a spinning expert ended %d of its 2 batches", n)
		}
	}
	for i, p := range spinners {
		if n := p.twice.Load(); n > 0 {
			t.Errorf("spinner %d started a batch while its own ran, %d times", i, n)
		}
	}
	if n := worstInGuest.Load(); n != 2 {
		t.Errorf("mallory had up to %d batches in guest code at once, want 2", n)
	}
	if n := overlap.Load(); n > 0 {
		t.Errorf("kernel steps of two batches overlapped %d times", n)
	}
}

func (p *guestPool) ended() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.ends...)
}
