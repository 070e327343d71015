package host

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

func trapInput(first float64) []*moehostv1.Tensor {
	return []*moehostv1.Tensor{tensor([]int64{1, 4}, []float64{first, 0, 0, 0})}
}

// TestTimedOutInstanceIsReplaced sends a request that makes the guest loop
// forever with a client deadline: the caller gets DeadlineExceeded, the
// instance is discarded, and the next request runs on a new one.
func TestTimedOutInstanceIsReplaced(t *testing.T) {
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+testServer.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "trap.0", Inputs: trapInput(-1000)}))
	if codeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("looping guest: %v, want DeadlineExceeded", err)
	}
	if el := time.Since(begin); el > 10*time.Second {
		t.Errorf("the deadline took %v to fire", el)
	}
	res, err := c.Forward(context.Background(), connect.NewRequest(&moehostv1.ForwardRequest{Uid: "trap.0", Inputs: trapInput(5)}))
	if err != nil {
		t.Fatalf("request after the timeout: %v", err)
	}
	if got := floats(t, res.Msg.GetOutputs()[0]); got[0] != 5 {
		t.Errorf("identity expert returned %v", got)
	}
}

// TestRepeatedFailuresMarkUnhealthy checks that Info shows an expert that
// keeps failing as unhealthy, and healthy again after a success.
func TestRepeatedFailuresMarkUnhealthy(t *testing.T) {
	ctx := context.Background()
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+testServer.Addr())
	healthy := func() bool {
		info, err := c.Info(ctx, connect.NewRequest(&moehostv1.InfoRequest{Uid: "trap.0"}))
		if err != nil {
			t.Fatal(err)
		}
		return info.Msg.GetHealthy()
	}
	for i := range unhealthyAfter {
		if !healthy() {
			t.Fatalf("unhealthy after %d failures", i)
		}
		if _, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "trap.0", Inputs: trapInput(-1)})); codeOf(err) != connect.CodeInternal {
			t.Fatalf("trap: %v", err)
		}
	}
	if healthy() {
		t.Errorf("healthy after %d failures in a row", unhealthyAfter)
	}
	// Other experts are unaffected.
	x := tensor([]int64{1, smallHidden}, make([]float64, smallHidden))
	if _, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "small.0", Inputs: []*moehostv1.Tensor{x}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "trap.0", Inputs: trapInput(1)})); err != nil {
		t.Fatal(err)
	}
	if !healthy() {
		t.Error("still unhealthy after a success")
	}
}

// TestPoolStatsAndMetrics checks that batches show up in Info and on
// /metrics.
func TestPoolStatsAndMetrics(t *testing.T) {
	ctx := context.Background()
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+testServer.Addr())
	x := tensor([]int64{3, smallHidden}, make([]float64, 3*smallHidden))
	for range 4 {
		if _, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "small.0", Inputs: []*moehostv1.Tensor{x}})); err != nil {
			t.Fatal(err)
		}
	}
	info, err := c.Info(ctx, connect.NewRequest(&moehostv1.InfoRequest{Uid: "small.0"}))
	if err != nil {
		t.Fatal(err)
	}
	fp := info.Msg.GetForwardPool()
	if fp.GetBatches() < 4 || fp.GetSamples() < 12 || fp.GetMeanBatchSize() <= 0 || fp.GetBatchesPerSecond() <= 0 ||
		fp.GetRunTimeMeanMs() <= 0 || fp.GetQueueWaitP99Ms() < fp.GetQueueWaitP50Ms() || fp.GetMaxBatchSize() != 1024 {
		t.Errorf("forward pool stats look wrong: %v", fp)
	}
	res, err := http.Get("http://" + testServer.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, want := range []string{
		`moehost_batches_total{expert="small.0",pool="forward"}`,
		`moehost_queue_depth{expert="small.0",pool="forward"} 0`,
		`moehost_batch_size_bucket{expert="small.0",pool="forward",le="4"}`,
		`moehost_queue_wait_seconds_count{expert="small.0",pool="forward"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestOversizedRequest checks that a request over the size limit is
// refused with ResourceExhausted before it is decoded, and that the server
// carries on.
func TestOversizedRequest(t *testing.T) {
	srv := startTestServer(t, WithMaxRequestBytes(64<<10),
		WithExperts(ExpertConfig{UID: "small.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": smallHidden}}))
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	ctx := context.Background()
	big := tensor([]int64{4096, smallHidden}, make([]float64, 4096*smallHidden)) // 128 KiB
	_, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "small.0", Inputs: []*moehostv1.Tensor{big}}))
	if codeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("oversized request: %v, want ResourceExhausted", err)
	}
	ok := tensor([]int64{2, smallHidden}, make([]float64, 2*smallHidden))
	if _, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "small.0", Inputs: []*moehostv1.Tensor{ok}})); err != nil {
		t.Fatal(err)
	}
}

// TestGuestLimits checks that the server's guest limits reach the sandbox:
// an ffn needs 5 ops per call, so a budget of 3 fails every batch with a
// message naming the budget, and a parameter budget below the ffn's size
// refuses the expert at start.
func TestGuestLimits(t *testing.T) {
	srv := startTestServer(t, WithGuestLimits(GuestLimits{OpsPerCall: 3}),
		WithExperts(ExpertConfig{UID: "small.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": smallHidden}}))
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	x := tensor([]int64{1, smallHidden}, make([]float64, smallHidden))
	_, err := c.Forward(context.Background(), connect.NewRequest(&moehostv1.ForwardRequest{Uid: "small.0", Inputs: []*moehostv1.Tensor{x}}))
	if codeOf(err) != connect.CodeResourceExhausted || !strings.Contains(messageOf(err), "more than 3 ops") {
		t.Fatalf("forward over the op budget: %v", err)
	}

	tight, err := New(WithListen("127.0.0.1:*"), WithDataDir(testDataDir), WithGuestLimits(GuestLimits{ParamBytes: 1024}),
		WithExperts(ExpertConfig{UID: "small.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": smallHidden}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := tight.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "parameter budget") {
		t.Errorf("start with a 1 KiB parameter budget: %v", err)
	}
	tight.Shutdown(context.Background())
}
