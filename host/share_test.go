package host

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// TestSharedInstances checks that experts of one module and config share
// one instance, and that through it each computes, and trains, exactly as
// on an instance of its own: a backward on one expert changes its outputs
// and no other's.
func TestSharedInstances(t *testing.T) {
	t.Parallel()
	experts := []ExpertConfig{
		{UID: "s.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": smallHidden}},
		{UID: "s.1", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": smallHidden}},
		{UID: "s.2", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": 2 * smallHidden}},
	}
	shared := startTestServer(t, WithOptimizer(OptimizerConfig{Name: "sgd", LR: 0.1}), WithExperts(experts...))
	alone := startTestServer(t, WithOptimizer(OptimizerConfig{Name: "sgd", LR: 0.1}), WithExperts(experts...), WithExclusiveInstances())
	if shared.expert("s.0").InstanceKey() != shared.expert("s.1").InstanceKey() || shared.expert("s.0").InstanceKey() == shared.expert("s.2").InstanceKey() {
		t.Fatal("experts of one module and config do not share an instance, or experts of two configs do")
	}
	if alone.expert("s.0").InstanceKey() == alone.expert("s.1").InstanceKey() {
		t.Fatal("WithExclusiveInstances shares an instance")
	}
	hc := &http.Client{}
	t.Cleanup(hc.CloseIdleConnections)
	clients := map[*Server]moehostv1connect.ExpertServiceClient{
		shared: moehostv1connect.NewExpertServiceClient(hc, "http://"+shared.Addr()),
		alone:  moehostv1connect.NewExpertServiceClient(hc, "http://"+alone.Addr()),
	}
	rng := rand.New(rand.NewPCG(3, 4))
	x := tensor([]int64{3, smallHidden}, randVec(rng, 3*smallHidden))
	ctx := context.Background()
	out := func(srv *Server, uid string) []byte {
		t.Helper()
		res, err := clients[srv].Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: uid, Inputs: []*moehostv1.Tensor{x}}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetOutputs()[0].GetData()
	}
	before0 := out(shared, "s.0")
	if bytes.Equal(before0, out(shared, "s.1")) {
		t.Fatal("two experts compute the same outputs; the test cannot tell them apart")
	}
	gy := tensor([]int64{3, smallHidden}, randVec(rng, 3*smallHidden))
	for _, c := range clients {
		if _, err := c.Backward(ctx, connect.NewRequest(&moehostv1.BackwardRequest{Uid: "s.1", Inputs: []*moehostv1.Tensor{x}, GradOutputs: []*moehostv1.Tensor{gy}})); err != nil {
			t.Fatalf("backward: %v", err)
		}
	}
	for _, uid := range []string{"s.0", "s.1"} {
		if !bytes.Equal(out(shared, uid), out(alone, uid)) {
			t.Errorf("%s on a shared instance differs from %s on its own", uid, uid)
		}
	}
	if !bytes.Equal(out(shared, "s.0"), before0) {
		t.Error("a backward on s.1 changed s.0")
	}
}
