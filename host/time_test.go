package host

import (
	"context"
	_ "embed"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// pickyWasm is an identity expert on x:float32[-1,4] that refuses a batch
// holding a 13, traps on one holding a 66, and runs as many ops as its
// first element says.
//
// Rebuild: wat2wasm testdata/picky.wat -o testdata/picky.wasm
//
//go:embed testdata/picky.wasm
var pickyWasm []byte

// rows returns a float32 tensor of the given [n, 4] values on dev.
func rows(t testing.TB, dev gpuhost.Device, v ...float32) *gpuhost.Tensor {
	t.Helper()
	x, err := dev.FromFloat32([]int{len(v) / 4, 4}, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func mustFloats(t testing.TB, dev gpuhost.Device, x *gpuhost.Tensor) []float32 {
	t.Helper()
	v, err := dev.Float32s(x)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitIdle waits until the pools of e are empty and no batch of e runs.
func waitIdle(t testing.TB, e *experts.Expert) {
	t.Helper()
	e.Barrier() // waits while a batch runs
	for f, b := e.QueueDepths(); f > 0 || b > 0; f, b = e.QueueDepths() {
		time.Sleep(time.Millisecond)
	}
	e.Barrier()
}

// waitRunning waits until a batch of e runs: its queue is empty and the
// expert is busy.
func waitRunning(t testing.TB, e *experts.Expert) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		if f, b := e.QueueDepths(); f+b > 0 {
			continue
		}
		if e.Running() {
			return
		}
	}
	t.Fatal("no batch started within a minute")
}

// TestCancelledBatchKeepsInstance cancels batches in the middle of their
// guest call: each stops between ops with Canceled, and the instance lives
// on (no restart), so the next request runs on it.
func TestCancelledBatchKeepsInstance(t *testing.T) {
	srv := startTestServer(t, WithExperts(ExpertConfig{UID: "picky.0", Module: ModuleBytes(pickyWasm)}))
	dev, e := srv.Device(), srv.expert("picky.0")
	const cancels = 4
	for range cancels {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			// 99,999 ops: seconds of work, unless stopped.
			_, err := srv.Forward(ctx, "picky.0", []*gpuhost.Tensor{rows(t, dev, 99999, 0, 0, 0)})
			done <- err
		}()
		waitRunning(t, e)
		time.Sleep(5 * time.Millisecond)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled forward: %v, want context.Canceled", err)
		}
		waitIdle(t, e)
	}
	// The pool records a batch just after its callers have their answer.
	info := e.Info()
	for end := time.Now().Add(10 * time.Second); info.GetForwardPool().GetFailedBatches() < cancels && time.Now().Before(end); info = e.Info() {
		time.Sleep(time.Millisecond)
	}
	if got := info.GetForwardPool().GetFailedBatches(); got != cancels {
		t.Errorf("%d failed batches, want %d: the cancellations did not reach running batches", got, cancels)
	}
	if got := info.GetStats().GetInstanceRestarts(); got != 0 {
		t.Errorf("%d instance restarts after %d cancellations, want 0", got, cancels)
	}
	out, err := srv.Forward(context.Background(), "picky.0", []*gpuhost.Tensor{rows(t, dev, 1, 2, 3, 4)})
	if err != nil {
		t.Fatalf("forward after the cancellations: %v", err)
	}
	if got := mustFloats(t, dev, out[0]); !slices.Equal(got, []float32{1, 2, 3, 4}) {
		t.Errorf("forward after the cancellations gave %v", got)
	}
	if got := e.Info().GetStats().GetInstanceRestarts(); got != 0 {
		t.Errorf("%d instance restarts, want 0", got)
	}
	if !info.GetHealthy() {
		t.Error("cancellations made the expert unhealthy")
	}
}

// TestBlameTheCulprit sends eight requests that form one batch, one of
// which holds a value the guest refuses: the culprit alone gets
// InvalidArgument with the guest's message, its batch-mates their own
// results, forward and backward, and the expert stays healthy.
func TestBlameTheCulprit(t *testing.T) {
	const n, culprit = 8, 5
	srv := startTestServer(t, WithOptimizer(OptimizerConfig{Name: "sgd", LR: 1}), WithExperts(ExpertConfig{
		UID: "picky.0", Module: ModuleBytes(pickyWasm),
		// The batch flushes once all eight are queued.
		Batching: &BatchLimits{MinBatchSize: n, MaxWait: time.Minute},
	}))
	dev, e := srv.Device(), srv.expert("picky.0")
	input := func(i int) []float32 {
		v := []float32{float32(i % 2), float32(10 * i), float32(10*i + 1), float32(10*i + 2)}
		if i == culprit {
			v[2] = 13
		}
		return v
	}
	tests := []struct {
		name string
		call func(ctx context.Context, x *gpuhost.Tensor) ([]*gpuhost.Tensor, error)
		want func(i int) []float32
	}{
		{"forward", func(ctx context.Context, x *gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
			return srv.Forward(ctx, "picky.0", []*gpuhost.Tensor{x})
		}, input},
		{"backward", func(ctx context.Context, x *gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
			// The expert is the identity: the input's gradient is the
			// output's, -x here.
			g := mustFloats(t, dev, x)
			for j := range g {
				g[j] = -g[j]
			}
			return srv.Backward(ctx, "picky.0", []*gpuhost.Tensor{x}, []*gpuhost.Tensor{rows(t, dev, g...)})
		}, func(i int) []float32 {
			v := input(i)
			for j := range v {
				v[j] = -v[j]
			}
			return v
		}},
	}
	for k, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var wg sync.WaitGroup
			outs := make([][]*gpuhost.Tensor, n)
			errs := make([]error, n)
			for i := range n {
				wg.Go(func() { outs[i], errs[i] = tt.call(context.Background(), rows(t, dev, input(i)...)) })
			}
			wg.Wait()
			for i := range n {
				if i == culprit {
					if errorCodes.Of(errs[i]) != connect.CodeInvalidArgument || !strings.Contains(errs[i].Error(), "input holds 13") {
						t.Errorf("culprit: %v, want invalid argument with the guest's message", errs[i])
					}
					continue
				}
				if errs[i] != nil {
					t.Errorf("request %d: %v", i, errs[i])
					continue
				}
				if got := mustFloats(t, dev, outs[i][0]); !slices.Equal(got, tt.want(i)) {
					t.Errorf("request %d got %v, want %v", i, got, tt.want(i))
				}
			}
			info := e.Info()
			pool := info.GetForwardPool()
			if tt.name == "backward" {
				pool = info.GetBackwardPool()
			}
			if pool.GetBatches() != 1 || pool.GetSamples() != n {
				t.Errorf("%d batches of %d rows in all, want the %d requests in one batch", pool.GetBatches(), pool.GetSamples(), n)
			}
			if !info.GetHealthy() || info.GetStats().GetInstanceRestarts() != 0 {
				t.Errorf("after a guest error: healthy %v, %d restarts", info.GetHealthy(), info.GetStats().GetInstanceRestarts())
			}
			_ = k
		})
	}
}

// TestTrapBlamesTheCulprit sends batches in which one or two requests make
// the guest trap: the batch is rerun one request at a time on fresh
// instances, so that a single culprit gets the trap (Internal) and all of
// its batch-mates their results; with two culprits the rerun stops at the
// second, and the requests after it get Unavailable instead of costing
// more instances.
func TestTrapBlamesTheCulprit(t *testing.T) {
	const n = 8
	tests := []struct {
		name     string
		culprits []int
		backward bool
		restarts int64 // the batch's trap, then each rerun trap that is not last
	}{
		{"forward, one culprit", []int{5}, false, 2},
		{"backward, one culprit", []int{5}, true, 2},
		{"forward, the last is the culprit", []int{n - 1}, false, 1},
		{"forward, two culprits", []int{2, 4}, false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startTestServer(t, WithOptimizer(OptimizerConfig{Name: "sgd", LR: 1}), WithExperts(ExpertConfig{
				UID: "picky.0", Module: ModuleBytes(pickyWasm),
				Batching: &BatchLimits{MinBatchSize: n, MaxWait: time.Minute},
			}))
			dev, e := srv.Device(), srv.expert("picky.0")
			input := func(i int) []float32 {
				v := []float32{0, float32(10 * i), float32(10*i + 1), float32(10*i + 2)}
				if slices.Contains(tt.culprits, i) {
					v[3] = 66
				}
				return v
			}
			var wg sync.WaitGroup
			outs := make([][]*gpuhost.Tensor, n)
			errs := make([]error, n)
			pool := func() int64 {
				if tt.backward {
					return e.Info().GetBackwardPool().GetQueueDepth()
				}
				return e.Info().GetForwardPool().GetQueueDepth()
			}
			for i := range n {
				x := rows(t, dev, input(i)...)
				// One at a time, so that the batch and its rerun keep
				// this order.
				for pool() < int64(i) {
					time.Sleep(time.Millisecond)
				}
				wg.Go(func() {
					if tt.backward {
						g := rows(t, dev, input(i)...)
						outs[i], errs[i] = srv.Backward(context.Background(), "picky.0", []*gpuhost.Tensor{x}, []*gpuhost.Tensor{g})
						return
					}
					outs[i], errs[i] = srv.Forward(context.Background(), "picky.0", []*gpuhost.Tensor{x})
				})
			}
			wg.Wait()
			last := tt.culprits[len(tt.culprits)-1]
			for i := range n {
				switch {
				case slices.Contains(tt.culprits, i):
					if errorCodes.Of(errs[i]) != connect.CodeFailedPrecondition || !errors.Is(errs[i], sandbox.ErrTrap) {
						t.Errorf("culprit %d: %v, want an internal error for the trap", i, errs[i])
					}
				case len(tt.culprits) > 1 && i > last:
					if errorCodes.Of(errs[i]) != connect.CodeUnavailable || !strings.Contains(errs[i].Error(), "trapped on 2 requests") {
						t.Errorf("request %d after the second culprit: %v, want unavailable", i, errs[i])
					}
				case errs[i] != nil:
					t.Errorf("request %d: %v", i, errs[i])
				default:
					if got := mustFloats(t, dev, outs[i][0]); !slices.Equal(got, input(i)) {
						t.Errorf("request %d got %v, want %v", i, got, input(i))
					}
				}
			}
			if got := e.Info().GetStats().GetInstanceRestarts(); got != tt.restarts {
				t.Errorf("%d instance restarts, want %d", got, tt.restarts)
			}
		})
	}
}

// TestSpinningExpertIsQuarantined hammers an expert whose guest spins
// forever while another expert answers: the spinning guest is killed at
// its own CallTimeout and quarantined, so that it holds the device worker
// for at most 1/(1+experts.QuarantineFactor) of the time, and the other expert
// answers correctly throughout.
func TestSpinningExpertIsQuarantined(t *testing.T) {
	// The well-behaved expert runs under the same call timeout, so it is
	// wide enough for a small ffn batch under -race on a busy machine.
	const timeout = 500 * time.Millisecond
	srv := startTestServer(t, WithGuestLimits(GuestLimits{CallTimeout: timeout}), WithExperts(
		ExpertConfig{UID: "trap.0", Module: ModuleBytes(trapWasm)},
		ExpertConfig{UID: "small.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": smallHidden}},
	))
	dev, spin := srv.Device(), srv.expert("trap.0")
	x := make([]float32, smallHidden)
	for i := range x {
		x[i] = float32(i) - 3
	}
	in := func() []*gpuhost.Tensor {
		t, _ := dev.FromFloat32([]int{1, smallHidden}, x)
		return []*gpuhost.Tensor{t}
	}
	ref, err := srv.Forward(context.Background(), "small.0", in())
	if err != nil {
		t.Fatal(err)
	}
	want := mustFloats(t, dev, ref[0])

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var unavailable, spun int
	begin := time.Now()
	wg.Go(func() {
		for ctx.Err() == nil {
			_, err := srv.Forward(ctx, "trap.0", []*gpuhost.Tensor{rows(t, dev, -1000, 0, 0, 0)})
			switch {
			case errorCodes.Of(err) == connect.CodeUnavailable:
				unavailable++
				time.Sleep(time.Millisecond)
			case errors.Is(err, context.DeadlineExceeded):
				spun++
			case ctx.Err() == nil:
				t.Errorf("spinning guest: %v, want DeadlineExceeded or Unavailable", err)
			}
		}
	})
	answers := 0
	for time.Since(begin) < 6*time.Second {
		out, err := srv.Forward(context.Background(), "small.0", in())
		if err != nil {
			t.Fatalf("the other expert failed: %v", err)
		}
		if got := mustFloats(t, dev, out[0]); !slices.Equal(got, want) {
			t.Fatalf("the other expert answered %v, want %v", got, want)
		}
		answers++
	}
	stop()
	wg.Wait()
	elapsed := time.Since(begin)
	timeouts := spin.Info().GetStats().GetCallTimeouts()
	// Each timeout holds the worker for one call timeout and is followed
	// by a quarantine of at least experts.QuarantineFactor of them.
	bound := 1 + int64(elapsed/(timeout*(1+experts.QuarantineFactor)))
	if timeouts < 1 || timeouts > bound || int64(spun) != timeouts {
		t.Errorf("%d call timeouts (%d seen by the caller) in %v, want 1 to %d", timeouts, spun, elapsed, bound)
	}
	if unavailable == 0 {
		t.Error("no request was refused during the quarantine")
	}
	t.Logf("%d answers from the other expert, %d timeouts, %d refused in %v", answers, timeouts, unavailable, elapsed)
}

// TestSnapshotOfASpinningExpert: a snapshot (a checkpoint save, on the
// device worker) of an expert whose guest spins waits for the spin to end
// without holding the device, so that another of the operator's experts
// is served meanwhile (it used to wait for the spinning batch), and a
// tenant's spinning expert cannot deadlock the worker behind a snapshot
// waiting on the device.
func TestSnapshotOfASpinningExpert(t *testing.T) {
	const timeout = 2 * time.Second
	srv := startTestServer(t, WithGuestLimits(GuestLimits{CallTimeout: timeout}),
		WithCheckpoints(CheckpointConfig{}), WithExperts(
			ExpertConfig{UID: "trap.0", Module: ModuleBytes(trapWasm)},
			ExpertConfig{UID: "small.0", Module: ModuleBytes(wasmexperts.FFNC), Config: map[string]int64{"hidden_dim": smallHidden}},
		))
	dev := srv.Device()
	x := make([]float32, smallHidden)
	small := func() error {
		in, err := dev.FromFloat32([]int{1, smallHidden}, x)
		if err != nil {
			return err
		}
		// Bounded, so that a stuck worker fails the test, not hangs it.
		ctx, cancel := context.WithTimeout(context.Background(), 3*timeout)
		defer cancel()
		_, err = srv.Forward(ctx, "small.0", []*gpuhost.Tensor{in})
		return err
	}
	if err := small(); err != nil {
		t.Fatal(err)
	}
	spun := make(chan error, 1)
	go func() {
		_, err := srv.Forward(context.Background(), "trap.0", []*gpuhost.Tensor{rows(t, dev, -1000, 0, 0, 0)})
		spun <- err
	}()
	time.Sleep(100 * time.Millisecond) // trap.0 spins
	saved := make(chan error, 1)
	go func() {
		_, err := srv.experts.SaveCheckpoint(context.Background(), srv.expert("trap.0"))
		saved <- err
	}()
	time.Sleep(100 * time.Millisecond) // the save waits for trap.0
	start := time.Now()
	for range 10 {
		if err := small(); err != nil {
			t.Fatalf("small.0 beside a spinning trap.0 and its snapshot: %v", err)
		}
	}
	if took := time.Since(start); took > timeout/2 {
		t.Errorf("10 calls of small.0 took %v beside a spinning trap.0 and a snapshot waiting for it (the spin lasts %v)", took, timeout)
	}
	select {
	case err := <-spun:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("the spinning call: %v, want DeadlineExceeded", err)
		}
	case <-time.After(3 * timeout):
		t.Fatal("the spinning call did not end")
	}
	select {
	case err := <-saved:
		t.Logf("the save after the spin: %v", err)
	case <-time.After(3 * timeout):
		t.Fatal("the save of trap.0 never ended: the device worker is stuck")
	}
	if err := small(); err != nil {
		t.Errorf("small.0 after the spin: %v", err)
	}
}
