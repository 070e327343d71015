package sandbox_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/sandbox"
)

// compileCache is make test's shared compilation cache, which holds the
// built-ins (nop_delay among them) compiled, or else a fresh one: a Go
// module's compile takes seconds under -race, and holds the process's
// compile lock meanwhile, which other tests' compiles wait for.
func compileCache(t *testing.T) string {
	if dir := os.Getenv("MOEHOST_COMPILE_CACHE"); dir != "" {
		return dir
	}
	return t.TempDir()
}

// compileNopDelay compiles nop_delay on a runtime with callTimeout,
// closed at the test's end.
func compileNopDelay(t *testing.T, callTimeout time.Duration) *sandbox.Module {
	t.Helper()
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(ctx, compileCache(t), sandbox.Limits{CallTimeout: callTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	m, err := rt.Compile(ctx, wasmexperts.NopDelay)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestGuestSleeps runs nop_delay (time.Sleep in moe_forward): within a
// call its sleep really waits, its callers leaving cut it short, and the instance then answers the next call.
func TestGuestSleeps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const delay = 300 * time.Millisecond
	m := compileNopDelay(t, 2*time.Second)
	dev := gpuhost.NewCPU(1)
	start := time.Now()
	inst, err := m.Instantiate(ctx, sandbox.Binding{Device: dev, Params: sandbox.NewParamStore(dev, []byte("s"), 0),
		Config: map[string]int64{"hidden_dim": 2, "delay_ms": delay.Milliseconds()}})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	t.Logf("instantiated in %v", time.Since(start))
	x, err := dev.FromFloat32([]int{1, 2}, []float32{1.5, -2})
	if err != nil {
		t.Fatal(err)
	}
	forward := func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		_, err := inst.Forward(ctx, []*gpuhost.Tensor{x}, nil)
		return time.Since(start), err
	}

	// The sleep waits (twice: each call sleeps anew, whatever the guest's
	// clock read before).
	for i := range 2 {
		took, err := forward(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("call %d took %v", i, took)
		if took < delay || took > delay+time.Second {
			t.Errorf("call %d took %v, want about %v", i, took, delay)
		}
	}

	// A caller that leaves ends the sleep: the call returns its
	// cancellation soon after, and the instance lives on.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	took, err := forward(cctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled call returned %v, want context.Canceled", err)
	}
	if took > delay-100*time.Millisecond {
		t.Errorf("a call cancelled after 50ms took %v", took)
	}
	if took, err := forward(ctx); err != nil || took < delay {
		t.Errorf("after the cancelled call: %v, %v", took, err)
	}
}

// TestGuestSleepBoundedByCallTimeout checks that a sleep longer than the
// call timeout ends at the timeout.
func TestGuestSleepBoundedByCallTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const timeout = 200 * time.Millisecond
	m := compileNopDelay(t, timeout)
	dev := gpuhost.NewCPU(1)
	inst, err := m.Instantiate(ctx, sandbox.Binding{Device: dev, Params: sandbox.NewParamStore(dev, []byte("s"), 0),
		Config: map[string]int64{"hidden_dim": 2, "delay_ms": 20_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	x, err := dev.FromFloat32([]int{1, 2}, []float32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = inst.Forward(ctx, []*gpuhost.Tensor{x}, nil)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a 20 s sleep under a %v call timeout returned %v, want context.DeadlineExceeded", timeout, err)
	}
	if took < timeout || took > timeout+2*time.Second {
		t.Errorf("a 20 s sleep under a %v call timeout took %v", timeout, took)
	}
}
