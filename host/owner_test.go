package host

import (
	"context"
	"errors"
	"net/http"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/host/internal/experts"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// TestTensorsReleasedWithoutGC turns the garbage collector off and drives
// every way a request's tensors can end: answered (in process and over
// RPC), refused for a full queue, for a quarantine and by a closed pool,
// cancelled while queued and while running, a split request whose
// answered piece nobody collects because its sibling trapped, and a
// backward batch rerun request by request (backwardEach) whose parameter
// gradients are summed, with aliased ones among them. The
// device's live bytes must come back exactly to what the experts hold
// for themselves (parameters and optimizer state), measured after a
// warm-up: every path released its tensors, none waited for a collection.
func TestTensorsReleasedWithoutGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// The call timeout is the window in which the test queues requests
	// behind a looping one (below): at 100 ms a loaded machine closed it
	// before the queue was full.
	const timeout = 400 * time.Millisecond
	srv := startTestServer(t,
		WithGuestLimits(GuestLimits{CallTimeout: timeout}),
		WithBatching(BatchLimits{MaxBatchSize: 2, MaxWait: time.Millisecond, QueueSize: 3}),
		WithOptimizer(OptimizerConfig{Name: "adam", LR: 1e-3}),
		WithExperts(
			ExpertConfig{UID: "ffn.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": 16}},
			ExpertConfig{UID: "trap.0", Module: ModuleBytes(trapWasm)},
			// Loops beside trap.0 (on the instance's spare), so that the
			// operator has its two batches in flight and alias.0 queues.
			ExpertConfig{UID: "trap.1", Module: ModuleBytes(trapWasm)},
			// Its moe_backward fails a batch of more than one row (its
			// parameter gradient is the output gradient, which fits only
			// a batch of one), so a batch of three one-row requests is
			// rerun one by one and their gradients summed.
			ExpertConfig{UID: "alias.0", Module: ModuleBytes(aliasBackwardWasm),
				Batching: &BatchLimits{MaxBatchSize: 3, MaxWait: time.Millisecond, QueueSize: 3}},
		))
	ctx := context.Background()
	dev := srv.Device()
	ffn, trap, alias := srv.expert("ffn.0"), srv.expert("trap.0"), srv.expert("alias.0")
	ffnIn, _ := ffn.Schema()
	width := int(ffnIn[0].GetShape()[1])
	live := func() int64 { return srv.MemoryStats()[0].LiveBytes }
	x := func(rows int, first float32) *gpuhost.Tensor {
		v := make([]float32, rows*4)
		v[0] = first
		return rows2(t, dev, rows, 4, v)
	}
	fx := func(rows int) *gpuhost.Tensor { return rows2(t, dev, rows, width, make([]float32, rows*width)) }
	// call runs one in-process request and releases what the caller holds.
	call := func(ctx context.Context, uid string, in *gpuhost.Tensor, grad *gpuhost.Tensor) error {
		var out []*gpuhost.Tensor
		var err error
		if grad != nil {
			out, err = srv.Backward(ctx, uid, []*gpuhost.Tensor{in}, []*gpuhost.Tensor{grad})
		} else {
			out, err = srv.Forward(ctx, uid, []*gpuhost.Tensor{in})
		}
		dev.Release(in, grad)
		dev.Release(out...)
		return err
	}
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	wire := func(rows int) *moehostv1.Tensor {
		return tensor([]int64{int64(rows), int64(width)}, make([]float64, rows*width))
	}
	rpcCalls := func() error {
		if _, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "ffn.0", Inputs: []*moehostv1.Tensor{wire(3)}})); err != nil {
			return err
		}
		_, err := c.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{Uid: "ffn.0",
			Inputs: []*moehostv1.Tensor{wire(3)}, GradOutputs: []*moehostv1.Tensor{wire(3)}}))
		return err
	}

	// Warm-up: the optimizer's state exists after a first step.
	if err := call(ctx, "ffn.0", fx(3), fx(3)); err != nil {
		t.Fatal(err)
	}
	if err := call(ctx, "trap.0", x(1, 1), nil); err != nil {
		t.Fatal(err)
	}
	a := func(v ...float32) *gpuhost.Tensor { return rows2(t, dev, 1, 2, v) }
	if err := call(ctx, "alias.0", a(3, 4), a(0.25, -1)); err != nil {
		t.Fatal(err)
	}
	base := live()
	if base == 0 {
		t.Fatal("no live bytes after the warm-up: the experts hold no parameters?")
	}

	// Answered, in process (split in pieces of 2 rows) and over RPC.
	if err := call(ctx, "ffn.0", fx(5), nil); err != nil {
		t.Fatal(err)
	}
	if err := call(ctx, "ffn.0", fx(5), fx(5)); err != nil {
		t.Fatal(err)
	}
	if err := call(ctx, "trap.0", x(3, 1), x(3, 1)); err != nil {
		t.Fatal(err)
	}
	if err := rpcCalls(); err != nil {
		t.Fatal(err)
	}
	// A split request whose second piece traps: the first piece's answer
	// is nobody's.
	{
		in := x(4, 1)
		v, _ := dev.Float32s(in)
		v[8] = -1
		dev.Release(in)
		in, _ = dev.FromFloat32([]int{4, 4}, v)
		if err := call(ctx, "trap.0", in, nil); !errors.Is(err, sandbox.ErrTrap) {
			t.Fatalf("split request with a trapping piece: %v, want a trap", err)
		}
	}

	// Given up while running: the caller leaves a looping request. It
	// costs a quarantine, which is waited out.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := call(short, "trap.0", x(1, -1000), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("given up while running: %v, want DeadlineExceeded", err)
	}
	cancelShort()
	for deadline := time.Now().Add(20 * time.Second); trap.CheckQuarantine() != nil || trap.QuarantineStrikes() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("trap.0 is still quarantined")
		}
	}

	// The worker loops on a request until the call timeout; behind it,
	// requests queue, give up, are refused, and the pool closes on the
	// rest.
	var wg sync.WaitGroup
	go1 := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	waitDepth := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); fwdDepth(trap) != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("trap.0's queue holds %d, want %d", fwdDepth(trap), n)
			}
		}
	}
	go1(func() {
		if err := call(ctx, "trap.0", x(1, -1000), nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("looping request: %v, want DeadlineExceeded", err)
		}
	})
	waitDepth(0) // running
	go1(func() {
		if err := call(ctx, "trap.1", x(1, -1000), nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("trap.1's looping request: %v, want DeadlineExceeded", err)
		}
	})
	trap1 := srv.expert("trap.1")
	for deadline := time.Now().Add(10 * time.Second); !trap1.Running(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("trap.1's looping request does not run")
		}
	}
	time.Sleep(20 * time.Millisecond)
	// Three one-row backward requests of alias.0 queue behind the two
	// (the operator's two batches in flight), and run as one batch once
	// one stops.
	aliasSteps := alias.Info().GetStats().GetBackwardBatches()
	for i := range 3 {
		go1(func() {
			if err := call(ctx, "alias.0", a(3, 4), a(float32(i), -1)); err != nil {
				t.Errorf("alias.0's backward %d: %v", i, err)
			}
		})
	}
	for deadline := time.Now().Add(10 * time.Second); bwdDepth(alias) != 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("alias.0's queue holds %d, want 3", bwdDepth(alias))
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	go1(func() { _ = call(cancelled, "trap.0", x(1, 1), nil) })
	// The two left queued when the pool closes are refused by it.
	closed := func(err error) {
		if !errors.Is(err, batch.ErrClosed) {
			t.Errorf("queued when the pool closed: %v, want ErrClosed", err)
		}
	}
	go1(func() { closed(call(ctx, "trap.0", x(1, 1), nil)) })
	go1(func() { closed(call(ctx, "trap.0", x(2, 1), nil)) })
	waitDepth(3)
	if err := call(ctx, "trap.0", x(1, 1), nil); !errors.Is(err, batch.ErrQueueFull) {
		t.Errorf("over the queue: %v, want ErrQueueFull", err)
	}
	cancel() // given up while queued
	waitDepth(2)
	trap.ClosePools(nil)
	wg.Wait()
	// One optimizer step for the three: they ran as one batch, which
	// failed and was rerun request by request.
	if steps := alias.Info().GetStats().GetBackwardBatches() - aliasSteps; steps != 1 {
		t.Errorf("alias.0 took %d steps for three queued requests, want 1 (one batch, rerun one by one)", steps)
	}
	// Refused for the quarantine, in process and over RPC.
	if err := call(ctx, "trap.0", x(1, 1), x(1, 1)); !errors.Is(err, ErrQuarantined) {
		t.Errorf("after the timeout: %v, want ErrQuarantined", err)
	}
	if _, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "trap.0",
		Inputs: []*moehostv1.Tensor{tensor([]int64{1, 4}, []float64{1, 0, 0, 0})}})); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("RPC during the quarantine: %v, want Unavailable", err)
	}

	if got := live(); got != base {
		t.Errorf("live device bytes %d after the requests, want %d (parameters and optimizer state): %d leaked until a collection", got, base, got-base)
	}
}

// fwdDepth and bwdDepth are an expert's queues' depths.
func fwdDepth(e *experts.Expert) int { f, _ := e.QueueDepths(); return f }
func bwdDepth(e *experts.Expert) int { _, b := e.QueueDepths(); return b }
