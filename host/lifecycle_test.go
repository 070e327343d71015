package host_test

import (
	"context"
	_ "embed"
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

func smallFFN(uid string) host.ExpertConfig {
	return host.ExpertConfig{UID: uid, Module: host.ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": 8}}
}

// counts returns the process's goroutines and open file descriptors.
func counts(t *testing.T) (goroutines, fds int) {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return runtime.NumGoroutine(), len(entries)
}

// settle waits until the counts drop back to at most the baseline.
func settle(t *testing.T, g0, fd0 int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, fd := counts(t)
		if g <= g0 && fd <= fd0 {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines %d (were %d), fds %d (were %d)\n%s", g, g0, fd, fd0, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStartShutdownLoopLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	// Small WAT experts keep 50 servers quick under -race. One warm-up
	// run fills the compilation cache.
	run := func(i int) string {
		srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(dir), host.WithExperts(
			host.ExpertConfig{UID: "id.0", Module: host.ModuleBytes(host.TrapWasm())},
			host.ExpertConfig{UID: "id.1", Module: host.ModuleBytes(host.TrapWasm())}))
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(ctx); err != nil {
			t.Fatalf("server %d: %v", i, err)
		}
		c := client.New(srv.Addr())
		if _, err := c.Expert("id.1").Forward(ctx, client.Float32([]int64{1, 4}, make([]float32, 4))); err != nil {
			t.Fatalf("server %d: %v", i, err)
		}
		c.Close()
		addr := srv.Addr()
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatalf("server %d shutdown: %v", i, err)
		}
		return addr
	}
	run(-1)
	g0, fd0 := counts(t)
	var last string
	for i := range 50 {
		last = run(i)
	}
	settle(t, g0, fd0)
	// The port is free at once for a new server.
	srv, err := host.New(host.WithListen(last), host.WithDataDir(dir), host.WithExperts(smallFFN("ffn.0")))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatalf("rebinding %s: %v", last, err)
	}
	srv.Shutdown(ctx)
}

func TestStartFailsPromptlyAndCleanly(t *testing.T) {
	dir := t.TempDir()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	expired, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-expired.Done()
	tests := []struct {
		name string
		ctx  context.Context
		opts []host.Option
		want func(error) bool
	}{
		{"port taken", context.Background(), []host.Option{host.WithListen(taken.Addr().String()), host.WithExperts(smallFFN("ffn.0"))},
			func(err error) bool { return strings.Contains(err.Error(), "address already in use") }},
		{"bad module", context.Background(), []host.Option{host.WithExperts(host.ExpertConfig{UID: "bad.0", Module: host.ModuleBytes([]byte("not wasm"))})},
			func(err error) bool { return errors.Is(err, host.ErrInvalidModule) }},
		{"context timed out", expired, []host.Option{host.WithExperts(smallFFN("ffn.0"))},
			func(err error) bool { return errors.Is(err, context.DeadlineExceeded) }},
	}
	g0, fd0 := counts(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := append([]host.Option{host.WithListen("127.0.0.1:*"), host.WithDataDir(dir)}, tt.opts...)
			srv, err := host.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			begin := time.Now()
			err = srv.Start(tt.ctx)
			if err == nil || !tt.want(err) {
				t.Fatalf("Start: %v", err)
			}
			if el := time.Since(begin); el > 10*time.Second {
				t.Errorf("Start took %v to fail", el)
			}
			if srv.Addr() != "" {
				select {
				case <-srv.Ready():
					t.Error("Ready is closed after a failed Start")
				default:
				}
			}
			if err := srv.Shutdown(context.Background()); err != nil {
				t.Errorf("Shutdown after a failed Start: %v", err)
			}
		})
	}
	settle(t, g0, fd0)
}

func TestConcurrentShutdownWithRequestsInFlight(t *testing.T) {
	ctx := context.Background()
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
		host.WithBatching(host.BatchLimits{MaxBatchSize: 4, MinBatchSize: 4, MaxWait: 20 * time.Millisecond}),
		host.WithExperts(smallFFN("ffn.0"), smallFFN("ffn.1")))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := client.New(srv.Addr())
	const callers = 40
	results := make(chan error, callers)
	var started sync.WaitGroup
	for i := range callers {
		started.Add(1)
		go func() {
			started.Done()
			for j := 0; ; j++ {
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := c.Expert([]string{"ffn.0", "ffn.1"}[(i+j)%2]).Forward(rctx, client.Float32([]int64{3, 8}, make([]float32, 24)))
				cancel()
				if err != nil {
					results <- err
					return
				}
			}
		}()
	}
	started.Wait()
	time.Sleep(100 * time.Millisecond) // requests are queued and running
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			errs[i] = srv.Shutdown(sctx)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Shutdown %d: %v", i, err)
		}
	}
	// Every caller ends with Unavailable: its queued request was failed,
	// or it could not connect any more. None hangs.
	for range callers {
		select {
		case err := <-results:
			if connect.CodeOf(err) != connect.CodeUnavailable {
				t.Errorf("request after shutdown: %v, want Unavailable", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a request hung after Shutdown")
		}
	}
}

// spinInitWasm is an expert whose moe_init loops forever.
//
// Rebuild: wat2wasm testdata/spin_init.wat -o testdata/spin_init.wasm
//
//go:embed testdata/spin_init.wasm
var spinInitWasm []byte

// TestShutdownDuringStart stops a server while it is still loading its
// experts, at several points of the load: its last expert never finishes
// moe_init, so Start is always cut short by Shutdown and returns
// ErrServerClosed, Shutdown waits for it, and nothing is left.
func TestShutdownDuringStart(t *testing.T) {
	g0, fd0 := counts(t)
	for i := range 5 {
		srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
			// Without Shutdown, Start would wait 20s for the init.
			host.WithGuestLimits(host.GuestLimits{InitTimeout: 20 * time.Second}),
			host.WithExperts(smallFFN("ffn.0"), smallFFN("ffn.1"),
				host.ExpertConfig{UID: "spin.0", Module: host.ModuleBytes(spinInitWasm)}))
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan error, 1)
		go func() { started <- srv.Start(context.Background()) }()
		time.Sleep(time.Duration(i) * 5 * time.Millisecond)
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Errorf("Shutdown during Start: %v", err)
		}
		select {
		case err := <-started:
			// Cut short, not timed out: the init's 20s never ran out.
			if !errors.Is(err, host.ErrServerClosed) || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Start cut short by Shutdown: %v, want ErrServerClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Start still loading 10s after Shutdown")
		}
	}
	settle(t, g0, fd0)
}
