package host

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host/internal/experts"
)

func trapInput(first float64) []*moehostv1.Tensor {
	return []*moehostv1.Tensor{tensor([]int64{1, 4}, []float64{first, 0, 0, 0})}
}

// TestTimedOutInstanceIsReplaced sends a request that makes the guest loop
// forever, with no client deadline: the guest's own CallTimeout stops it
// whatever the load (wazero checks the deadline in every loop), the caller
// gets DeadlineExceeded, the expert is quarantined (Unavailable), and once
// the quarantine ends the next request runs on a new instance.
func TestTimedOutInstanceIsReplaced(t *testing.T) {
	const timeout = 200 * time.Millisecond
	srv := startTestServer(t, WithGuestLimits(GuestLimits{CallTimeout: timeout}),
		WithExperts(ExpertConfig{UID: "trap.0", Module: ModuleBytes(trapWasm)}))
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	ctx := context.Background()
	forward := func(first float64) (*connect.Response[moehostv1.ForwardResponse], error) {
		return c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "trap.0", Inputs: trapInput(first)}))
	}
	info := func() *moehostv1.ExpertInfo {
		res, err := c.Info(ctx, connect.NewRequest(&moehostv1.InfoRequest{Uid: "trap.0"}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg
	}
	if _, err := forward(-1000); codeOf(err) != connect.CodeDeadlineExceeded || !strings.Contains(messageOf(err), "call timeout") {
		t.Fatalf("looping guest: %v, want DeadlineExceeded naming the call timeout", err)
	}
	if st := info().GetStats(); st.GetCallTimeouts() != 1 || st.GetInstanceRestarts() != 0 {
		t.Fatalf("after the timeout: %v, want 1 call timeout and no restart yet", st)
	}
	if _, err := forward(5); codeOf(err) != connect.CodeUnavailable || !strings.Contains(messageOf(err), "quarantined") {
		t.Fatalf("request during the quarantine: %v, want Unavailable", err)
	}
	// The quarantine lasts experts.QuarantineFactor call timeouts.
	time.Sleep(experts.QuarantineFactor*timeout + 50*time.Millisecond)
	res, err := forward(5)
	if err != nil {
		t.Fatalf("request after the quarantine: %v", err)
	}
	if got := floats(t, res.Msg.GetOutputs()[0]); !slices.Equal(got, []float32{5, 0, 0, 0}) {
		t.Errorf("identity expert returned %v", got)
	}
	if st := info().GetStats(); st.GetInstanceRestarts() != 1 {
		t.Errorf("%d instance restarts, want 1", st.GetInstanceRestarts())
	}
	m, err := http.Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Body.Close()
	body, _ := io.ReadAll(m.Body)
	if want := `moehost_instance_restarts_total{expert="trap.0"} 1`; !strings.Contains(string(body), want) {
		t.Errorf("/metrics lacks %s", want)
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
	for i := range experts.UnhealthyAfter {
		if !healthy() {
			t.Fatalf("unhealthy after %d failures", i)
		}
		if _, err := c.Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "trap.0", Inputs: trapInput(-1)})); codeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("trap: %v", err)
		}
	}
	if healthy() {
		t.Errorf("healthy after %d failures in a row", experts.UnhealthyAfter)
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
	t.Parallel()
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
// an ffn needs 3 ops per call (linear_gelu_tanh, linear, add_layer_norm),
// so a budget of 2 fails every batch with a message naming the budget,
// and a parameter budget below the ffn's size
// refuses the expert at start.
func TestGuestLimits(t *testing.T) {
	t.Parallel()
	srv := startTestServer(t, WithGuestLimits(GuestLimits{OpsPerCall: 2}),
		WithExperts(ExpertConfig{UID: "small.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": smallHidden}}))
	c := moehostv1connect.NewExpertServiceClient(http.DefaultClient, "http://"+srv.Addr())
	x := tensor([]int64{1, smallHidden}, make([]float64, smallHidden))
	_, err := c.Forward(context.Background(), connect.NewRequest(&moehostv1.ForwardRequest{Uid: "small.0", Inputs: []*moehostv1.Tensor{x}}))
	if codeOf(err) != connect.CodeResourceExhausted || !strings.Contains(messageOf(err), "more than 2 ops") {
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
