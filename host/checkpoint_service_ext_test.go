package host_test

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"testing"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/client"
)

func paramValues(t *testing.T, ps []*moehostv1.NamedTensor) map[string][]float32 {
	t.Helper()
	out := map[string][]float32{}
	for _, p := range ps {
		d := p.GetTensor().GetData()
		v := make([]float32, len(d)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(d[4*i:]))
		}
		out[p.GetName()] = v
	}
	return out
}

// TestCheckpointService saves, lists and restores over Connect, and checks
// that GetParameters follows the expert's training.
func TestCheckpointService(t *testing.T) {
	const h = 8
	ctx := context.Background()
	srv, err := ckptServer(t, t.TempDir(), wasmexperts.FFN, h, host.CheckpointConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	cc := moehostv1connect.NewCheckpointServiceClient(http.DefaultClient, "http://"+srv.Addr())
	c := client.New(srv.Addr())
	defer c.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	train(t, c, h, 3, rng)
	saved, err := cc.Save(ctx, connect.NewRequest(&moehostv1.CheckpointServiceSaveRequest{Uid: "ffn.0"}))
	if err != nil {
		t.Fatal(err)
	}
	if s := saved.Msg.GetCheckpoint(); s.GetStep() != 3 || s.GetSizeBytes() <= 0 {
		t.Fatalf("saved %v, want step 3", s)
	}
	p3, err := cc.GetParameters(ctx, connect.NewRequest(&moehostv1.CheckpointServiceGetParametersRequest{Uid: "ffn.0"}))
	if err != nil {
		t.Fatal(err)
	}
	if p3.Msg.GetStep() != 3 || len(p3.Msg.GetParameters()) == 0 {
		t.Fatalf("parameters at step %d: %d tensors", p3.Msg.GetStep(), len(p3.Msg.GetParameters()))
	}
	want := forward(t, c, h)
	train(t, c, h, 2, rng)
	if _, err := cc.Save(ctx, connect.NewRequest(&moehostv1.CheckpointServiceSaveRequest{Uid: "ffn.0"})); err != nil {
		t.Fatal(err)
	}
	list, err := cc.List(ctx, connect.NewRequest(&moehostv1.CheckpointServiceListRequest{Uid: "ffn.0"}))
	if err != nil {
		t.Fatal(err)
	}
	var steps []int64
	for _, in := range list.Msg.GetCheckpoints() {
		steps = append(steps, in.GetStep())
	}
	if !slices.Equal(steps, []int64{5, 3}) {
		t.Fatalf("listed steps %v, want [5 3]", steps)
	}
	step := int64(3)
	if _, err := cc.Restore(ctx, connect.NewRequest(&moehostv1.CheckpointServiceRestoreRequest{Uid: "ffn.0", Step: &step})); err != nil {
		t.Fatal(err)
	}
	if got := forward(t, c, h); !slices.Equal(got, want) {
		t.Fatalf("after restoring step 3: %v, want %v", got, want)
	}
	again, err := cc.GetParameters(ctx, connect.NewRequest(&moehostv1.CheckpointServiceGetParametersRequest{Uid: "ffn.0"}))
	if err != nil {
		t.Fatal(err)
	}
	a, b := paramValues(t, p3.Msg.GetParameters()), paramValues(t, again.Msg.GetParameters())
	for name, v := range a {
		if !slices.Equal(v, b[name]) {
			t.Errorf("parameter %q after the restore differs from step 3's", name)
		}
	}
	if again.Msg.GetStep() != 3 {
		t.Errorf("step after the restore %d, want 3", again.Msg.GetStep())
	}

	for _, tt := range []struct {
		name string
		call func() error
		code connect.Code
	}{
		{"unknown-expert", func() error {
			_, err := cc.Save(ctx, connect.NewRequest(&moehostv1.CheckpointServiceSaveRequest{Uid: "nope"}))
			return err
		}, connect.CodeNotFound},
		{"empty-uid", func() error {
			_, err := cc.List(ctx, connect.NewRequest(&moehostv1.CheckpointServiceListRequest{}))
			return err
		}, connect.CodeInvalidArgument},
		{"unknown-step", func() error {
			s := int64(99)
			_, err := cc.Restore(ctx, connect.NewRequest(&moehostv1.CheckpointServiceRestoreRequest{Uid: "ffn.0", Step: &s}))
			return err
		}, connect.CodeNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); connect.CodeOf(err) != tt.code {
				t.Errorf("got %v, want %v", err, tt.code)
			}
		})
	}
}

// TestCheckpointServiceAccess checks the admin token, and that without
// one the service is not served on a non-loopback listener.
func TestCheckpointServiceAccess(t *testing.T) {
	ctx := context.Background()
	start := func(listen string, opts ...host.Option) *host.Server {
		srv, err := host.New(append([]host.Option{host.WithListen(listen), host.WithDataDir(t.TempDir()),
			host.WithExperts(host.ExpertConfig{UID: "trap.0", Module: host.ModuleBytes(host.TrapWasm())})}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Shutdown(ctx) })
		return srv
	}
	list := func(addr, token string) error {
		cc := moehostv1connect.NewCheckpointServiceClient(http.DefaultClient, "http://"+addr)
		req := connect.NewRequest(&moehostv1.CheckpointServiceGetParametersRequest{Uid: "trap.0"})
		if token != "" {
			req.Header().Set("Authorization", "Bearer "+token)
		}
		_, err := cc.GetParameters(ctx, req)
		return err
	}
	tok := start("127.0.0.1:*", host.WithAdminToken("s3cret"))
	if err := list(tok.Addr(), ""); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("no token: %v, want Unauthenticated", err)
	}
	if err := list(tok.Addr(), "wrong"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("wrong token: %v, want Unauthenticated", err)
	}
	if err := list(tok.Addr(), "s3cret"); err != nil {
		t.Errorf("right token: %v", err)
	}
	loop := start("127.0.0.1:*")
	if err := list(loop.Addr(), ""); err != nil {
		t.Errorf("loopback listener, no token: %v", err)
	}
	open := start("0.0.0.0:*")
	_, port, _ := net.SplitHostPort(open.Addr())
	if err := list("127.0.0.1:"+port, ""); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("non-loopback listener without a token: %v, want Unimplemented (not served)", err)
	}
}
