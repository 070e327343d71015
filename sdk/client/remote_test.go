package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

// TestRemoteExpertSchemaCacheAndTimeout checks that CheckInputs rejects a
// bad batch locally from a schema fetched once (it still works after the
// server is gone), and that WithTimeout bounds calls.
func TestRemoteExpertSchemaCacheAndTimeout(t *testing.T) {
	t.Parallel()
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
		host.WithExperts(host.ExpertConfig{UID: "nop.0", Module: host.ModuleBytes(wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	c := client.New(srv.Addr())
	defer c.Close()
	good := client.Float32([]int64{3, 4}, make([]float32, 12))
	if err := c.Expert("nop.0").CheckInputs(ctx, good); err != nil {
		t.Fatalf("CheckInputs(good) = %v", err)
	}
	tests := []struct {
		name   string
		inputs []client.Tensor
		want   string
	}{
		{"wrong width", []client.Tensor{client.Float32([]int64{3, 5}, make([]float32, 15))}, "shape"},
		{"wrong rank", []client.Tensor{client.Float32([]int64{12}, make([]float32, 12))}, "shape"},
		{"two inputs", []client.Tensor{good, good}, "got 2 inputs, want 1"},
	}
	for _, tt := range tests {
		err := c.Expert("nop.0").CheckInputs(ctx, tt.inputs...)
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: CheckInputs = %v, want InvalidArgument mentioning %q", tt.name, err, tt.want)
		}
	}

	slow := client.New(srv.Addr(), client.WithTimeout(time.Nanosecond))
	defer slow.Close()
	if _, err := slow.Expert("nop.0").Forward(ctx, good); connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Errorf("Forward with a 1ns timeout = %v, want DeadlineExceeded", err)
	}

	// The schema is cached: with the server gone, the check still answers.
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Expert("nop.0").CheckInputs(ctx, tests[0].inputs...); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("CheckInputs after shutdown = %v, want the cached schema's InvalidArgument", err)
	}
}

// TestSwarmCachesEmptyNames checks negative caching: a name found empty
// is not looked up again within the negative TTL, even once it exists.
func TestSwarmCachesEmptyNames(t *testing.T) {
	t.Parallel()
	first := startExpertServer(t, "neg.0", nil)
	info, _ := first.DHT()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cachedSw, err := client.NewSwarm(ctx, info.Addrs, client.WithNegativeTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer cachedSw.Close()
	freshSw, err := client.NewSwarm(ctx, info.Addrs, client.WithCacheTTL(0), client.WithNegativeTTL(0))
	if err != nil {
		t.Fatal(err)
	}
	defer freshSw.Close()
	if found, err := cachedSw.Discover(ctx, []string{"late.0"}); err != nil || len(found) != 0 {
		t.Fatalf("late.0 before it exists: %v, %v", found, err)
	}
	startExpertServer(t, "late.0", info.Addrs)
	for deadline := time.Now().Add(20 * time.Second); ; {
		found, err := freshSw.Discover(ctx, []string{"late.0"})
		if err == nil && len(found["late.0"]) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("late.0 not found without caches: %v %v", found, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if found, err := cachedSw.Discover(ctx, []string{"late.0"}); err != nil || len(found) != 0 {
		t.Errorf("late.0 through the negative cache: %v, %v; want still nothing", found, err)
	}
}
