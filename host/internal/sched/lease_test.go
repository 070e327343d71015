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
}

func (p *guestPool) Poll() (time.Time, time.Time, bool) {
	return time.Time{}, time.Time{}, p.pending.Load() > 0
}

func (p *guestPool) RunBatch(ctx context.Context) {
	p.pending.Add(-1)
	l := sched.LeaseFrom(ctx)
	if l == nil {
		panic("no lease in the batch's context")
	}
	p.device(time.Millisecond)
	l.Leave()
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
// second between kernel steps is detached, and another group's batches
// run meanwhile, each within a few milliseconds; kernel steps never
// overlap, and the detached batch ends once it gets the device back.
func TestGuestCodeDoesNotHoldTheDevice(t *testing.T) {
	t.Parallel()
	var onDevice, overlap atomic.Int64
	spin := &guestPool{guest: time.Second, onDevice: &onDevice, overlap: &overlap}
	good := &guestPool{onDevice: &onDevice, overlap: &overlap}
	w := sched.NewWorker()
	w.Add(spin, sched.WithGroup("mallory", 1))
	w.Add(good, sched.WithGroup("alice", 1))
	w.Start(context.Background())
	defer w.Close(context.Background())

	spin.pending.Add(1)
	w.Notify()
	time.Sleep(50 * time.Millisecond) // mallory's guest is spinning
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
	t.Logf("alice's worst batch behind a guest that spins for 1 s: %v", worst)
	if worst > 100*time.Millisecond {
		t.Errorf("alice waited %v behind a spinning guest; the bound is 100 ms", worst)
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
}

func (p *guestPool) ended() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.ends...)
}
