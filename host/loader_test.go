package host

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
)

// spinInit is a module whose moe_init loops without calling the host
// (the same bytes as tests/frontdoor_api_test.go's spinInitWasm).
var spinInit = []byte{
	0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
	0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f,
	0x03, 0x04, 0x03, 0x00, 0x00, 0x00,
	0x05, 0x03, 0x01, 0x00, 0x01,
	0x07, 0x35, 0x04,
	0x06, 'm', 'e', 'm', 'o', 'r', 'y', 0x02, 0x00,
	0x0f, 'm', 'o', 'e', '_', 'a', 'b', 'i', '_', 'v', 'e', 'r', 's', 'i', 'o', 'n', 0x00, 0x00,
	0x08, 'm', 'o', 'e', '_', 'i', 'n', 'i', 't', 0x00, 0x01,
	0x0b, 'm', 'o', 'e', '_', 'f', 'o', 'r', 'w', 'a', 'r', 'd', 0x00, 0x02,
	0x0a, 0x15, 0x03,
	0x04, 0x00, 0x41, 0x01, 0x0b,
	0x09, 0x00, 0x03, 0x40, 0x0c, 0x00, 0x0b, 0x41, 0x00, 0x0b,
	0x04, 0x00, 0x41, 0x00, 0x0b,
}

// TestDeployDoesNotWaitForAnotherInit deploys an expert whose moe_init
// spins until its 2 s init timeout, and meanwhile deploys and undeploys
// another owner's experts, which must not wait for it.
func TestDeployDoesNotWaitForAnotherInit(t *testing.T) {
	srv := startTestServer(t, WithGuestLimits(GuestLimits{InitTimeout: 2 * time.Second}))
	ctx := context.Background()
	slow := make(chan error, 1)
	go func() {
		slow <- srv.Deploy(ctx, ExpertConfig{UID: "mallory.spin", Owner: "mallory", Module: ModuleBytes(spinInit)})
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	cfg := map[string]int64{"hidden_dim": 8}
	if err := srv.Deploy(ctx, ExpertConfig{UID: "alice.ffn.0", Owner: "alice", Module: ModuleBytes(wasmexperts.FFNC), Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Undeploy(ctx, "alice.ffn.0"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	err := <-slow
	t.Logf("alice's deploy and undeploy took %v; mallory's: %v", took, err)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the spinning deploy: %v, want its init timeout", err)
	}
	if took > time.Second {
		t.Errorf("alice's deploy and undeploy took %v behind mallory's moe_init", took)
	}
}

// TestLoaderHammer deploys and undeploys experts that share compiled
// modules and instances from many goroutines, the same uids included,
// and checks that every deploy either serves or is refused cleanly, and
// that nothing is left behind.
func TestLoaderHammer(t *testing.T) {
	srv := startTestServer(t)
	ctx := context.Background()
	cfg := map[string]int64{"hidden_dim": 8}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for i := range 8 {
				uid := fmt.Sprintf("t%d.ffn.%d", g%3, i%3) // two goroutines per uid
				err := srv.Deploy(ctx, ExpertConfig{UID: uid, Owner: fmt.Sprintf("t%d", g%3), Module: ModuleBytes(wasmexperts.FFNC), Config: cfg})
				if err != nil && !errors.Is(err, ErrExpertServed) {
					t.Errorf("deploy %s: %v", uid, err)
					continue
				}
				err = srv.Undeploy(ctx, uid)
				if err != nil && !errors.Is(err, ErrUnknownExpert) && !errors.Is(err, ErrNotRun) {
					t.Errorf("undeploy %s: %v", uid, err)
				}
			}
		})
	}
	wg.Wait()
	if st := srv.experts.LoaderStats(); st.Compiled != 0 || st.Slots != 0 || st.Busy != 0 {
		t.Errorf("left behind: %d compiled modules, %d instance slots, %d busy uids", st.Compiled, st.Slots, st.Busy)
	}
}

// TestDeploySharesAFailedStart deploys two experts of one spinning module
// and config: the second waits for the first's instance to start, and when
// that start fails at its init timeout, fails with its error instead of
// running the same moe_init again.
func TestDeploySharesAFailedStart(t *testing.T) {
	t.Parallel()
	srv := startTestServer(t, WithGuestLimits(GuestLimits{InitTimeout: 500 * time.Millisecond}))
	ctx := context.Background()
	first := make(chan error, 1)
	go func() { first <- srv.Deploy(ctx, ExpertConfig{UID: "spin.0", Module: ModuleBytes(spinInit)}) }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		n := srv.experts.LoaderStats().Starting
		if n > 0 {
			break // spin.0's instance is starting
		}
		if time.Now().After(deadline) {
			t.Fatal("spin.0's instance never started")
		}
	}
	second := srv.Deploy(ctx, ExpertConfig{UID: "spin.1", Module: ModuleBytes(spinInit)})
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("spin.0: %v, want its init timeout", err)
	}
	if !errors.Is(second, context.DeadlineExceeded) || !strings.Contains(second.Error(), `"spin.1": the instance it would share failed to start`) {
		t.Fatalf("spin.1: %v, want spin.0's failed start", second)
	}
}
