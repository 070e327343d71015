package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/tenant"
	"github.com/moehost/moehost/modules"
)

// TestDeployAndUndeployWhileServing deploys experts into a running server,
// checks they answer like experts it started with (the same module and
// uid give the same parameters, so the same outputs), shares an instance
// between two of them, and undeploys them: queued requests fail with
// Unavailable, the uid is gone from the table and /metrics, and the expert
// that shared the instance answers on.
func TestDeployAndUndeployWhileServing(t *testing.T) {
	ctx := context.Background()
	cfg := map[string]int64{"hidden_dim": 16}
	ref := startTestServer(t, WithExperts(
		ExpertConfig{UID: "ffn.1", Module: ModuleBytes(wasmexperts.FFNC), Config: cfg},
		ExpertConfig{UID: "ffn.2", Module: ModuleBytes(wasmexperts.FFNC), Config: cfg},
	))
	srv := startTestServer(t, WithExperts(ExpertConfig{UID: "picky.0", Module: ModuleBytes(pickyWasm)}))
	dev := srv.Device()
	xOn := func(dev gpuhost.Device) *gpuhost.Tensor {
		v := make([]float32, 2*16)
		for i := range v {
			v[i] = float32(i%5) - 2
		}
		return rows2(t, dev, 2, 16, v)
	}
	x := func() *gpuhost.Tensor { return xOn(dev) }
	want := func(uid string) []float32 {
		out, err := ref.Forward(ctx, uid, []*gpuhost.Tensor{xOn(ref.Device())})
		if err != nil {
			t.Fatal(err)
		}
		return mustFloats(t, ref.Device(), out[0])
	}
	check := func(uid string) {
		t.Helper()
		out, err := srv.Forward(ctx, uid, []*gpuhost.Tensor{x()})
		if err != nil {
			t.Fatalf("%s: %v", uid, err)
		}
		if got, w := mustFloats(t, dev, out[0]), want(uid); !slices.Equal(got, w) {
			t.Fatalf("%s answered %v, want %v (as served from the start)", uid, got[:4], w[:4])
		}
	}
	if _, err := srv.Forward(ctx, "ffn.1", []*gpuhost.Tensor{x()}); errorCodes.Of(err) != connect.CodeNotFound {
		t.Fatalf("before Deploy: %v, want not found", err)
	}
	for _, uid := range []string{"ffn.1", "ffn.2"} {
		if err := srv.Deploy(ctx, ExpertConfig{UID: uid, Module: ModuleBytes(wasmexperts.FFNC), Config: cfg, Owner: "alice"}); err != nil {
			t.Fatal(err)
		}
	}
	check("ffn.1")
	check("ffn.2")
	if a, b := srv.expert("ffn.1"), srv.expert("ffn.2"); a.InstanceKey() != b.InstanceKey() {
		t.Error("two experts of one module and config do not share an instance")
	}
	if got := srv.expert("ffn.1").Info().GetOwner(); got != "alice" {
		t.Errorf("owner %q, want alice", got)
	}
	if err := srv.Deploy(ctx, ExpertConfig{UID: "ffn.1", Module: ModuleBytes(wasmexperts.FFNC), Config: cfg}); errorCodes.Of(err) != connect.CodeAlreadyExists {
		t.Errorf("deploying a served uid: %v, want already exists", err)
	}
	if err := srv.Deploy(ctx, ExpertConfig{UID: "bad.0", Module: ModuleBytes([]byte("\x00asm junk"))}); !errors.Is(err, ErrInvalidModule) {
		t.Errorf("deploying a bad module: %v, want ErrInvalidModule", err)
	}
	if _, ok := srv.experts.Get("bad.0"); ok {
		t.Error("a failed Deploy left its uid served")
	}

	// Requests queued for an undeployed expert fail with Unavailable:
	// picky.0 waits for a full batch that never comes.
	if err := srv.Deploy(ctx, ExpertConfig{UID: "picky.1", Module: ModuleBytes(pickyWasm),
		Batching: &BatchLimits{MinBatchSize: 100, MaxWait: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { _, errs[i] = srv.Forward(ctx, "picky.1", []*gpuhost.Tensor{rows(t, dev, 1, 2, 3, 4)}) })
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		depth := srv.expert("picky.1").Info().GetForwardPool().GetQueueDepth()
		if depth >= 3 {
			break
		}
		if time.Now().After(deadline) {
			// A hang here once cost make test its 12-minute timeout;
			// fail with what is known instead.
			t.Fatalf("picky.1's queue holds %d requests after 30 s, want 3", depth)
		}
		time.Sleep(time.Millisecond)
	}
	if err := srv.Undeploy(ctx, "picky.1"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if errorCodes.Of(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "undeployed") {
			t.Errorf("queued request %d: %v, want unavailable", i, err)
		}
	}

	if err := srv.Undeploy(ctx, "ffn.1"); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Forward(ctx, "ffn.1", []*gpuhost.Tensor{x()}); errorCodes.Of(err) != connect.CodeNotFound {
		t.Errorf("after Undeploy: %v, want not found", err)
	}
	if err := srv.Undeploy(ctx, "ffn.1"); errorCodes.Of(err) != connect.CodeNotFound {
		t.Errorf("undeploying twice: %v, want not found", err)
	}
	check("ffn.2") // its shared instance stayed
	families, err := srv.prom.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "expert" && (l.GetValue() == "ffn.1" || l.GetValue() == "picky.1") {
					t.Errorf("%s still has a series for the undeployed %s", f.GetName(), l.GetValue())
				}
			}
		}
	}
	for _, e := range (table{srv.experts}).All() {
		if uid := e.Info().GetUid(); uid == "ffn.1" || uid == "picky.1" {
			t.Errorf("%s is still listed", uid)
		}
	}
	if err := srv.Undeploy(ctx, "ffn.2"); err != nil {
		t.Fatal(err)
	}
	if n := srv.experts.LoaderStats().Compiled; n != 1 {
		t.Errorf("%d compiled modules left, want 1 (picky.0's)", n)
	}
	check2 := func() {
		out, err := srv.Forward(ctx, "picky.0", []*gpuhost.Tensor{rows(t, dev, 0, 2, 3, 4)})
		if err != nil || !slices.Equal(mustFloats(t, dev, out[0]), []float32{0, 2, 3, 4}) {
			t.Errorf("the expert served from the start: %v", err)
		}
	}
	check2()
}

// rows2 makes a float32 tensor of shape [r, c].
func rows2(t testing.TB, dev gpuhost.Device, r, c int, v []float32) *gpuhost.Tensor {
	t.Helper()
	x, err := dev.FromFloat32([]int{r, c}, v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestDeploymentsSurviveARestart deploys experts live, restarts the
// server on the same data dir with none configured, and finds them back
// before Ready with the same digests, owners and outputs; an undeployed
// one stays gone, and a deployment whose module vanished is logged and
// kept for later instead of failing the start.
func TestDeploymentsSurviveARestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := map[string]int64{"hidden_dim": 8}
	start := func() *Server {
		return startTestServer(t, WithDataDir(dir))
	}
	srv := start()
	for _, ec := range []ExpertConfig{
		{UID: "alice.ffn.0", Owner: "alice", Module: ModuleBytes(wasmexperts.FFNC), Config: cfg, BackwardAccess: AccessOwner},
		{UID: "alice.ffn.1", Owner: "alice", Module: ModuleBytes(wasmexperts.FFNC), Config: cfg},
		{UID: "bob.picky", Owner: "bob", Module: ModuleBytes(pickyWasm)},
	} {
		if err := srv.Deploy(ctx, ec); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Undeploy(ctx, "alice.ffn.1"); err != nil {
		t.Fatal(err)
	}
	x := func(s *Server) []float32 {
		v := make([]float32, 8)
		for i := range v {
			v[i] = float32(i) - 3
		}
		out, err := s.Forward(ctx, "alice.ffn.0", []*gpuhost.Tensor{rows2(t, s.Device(), 1, 8, v)})
		if err != nil {
			t.Fatal(err)
		}
		return mustFloats(t, s.Device(), out[0])
	}
	before := x(srv)
	digests := map[string]string{}
	for _, e := range (table{srv.experts}).All() {
		digests[e.Info().GetUid()] = e.Info().GetModuleDigest()
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	srv = start()
	got := map[string]string{}
	for _, e := range (table{srv.experts}).All() {
		got[e.Info().GetUid()] = e.Info().GetModuleDigest()
	}
	if !maps.Equal(got, digests) || len(got) != 2 {
		t.Fatalf("after a restart: %v, want %v", got, digests)
	}
	if owner, _, backward := srv.expert("alice.ffn.0").Access(); owner != "alice" || backward != AccessOwner {
		t.Errorf("alice.ffn.0 came back with owner %q and backward access %v", owner, backward)
	}
	if after := x(srv); !slices.Equal(after, before) {
		t.Errorf("alice.ffn.0 answers %v after the restart, %v before", after, before)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	// bob's module disappears from the store: the server starts without
	// bob.picky and keeps its deployment for when the module is back.
	h, _ := modules.ParseDigest(digests["bob.picky"])
	if err := os.Remove(filepath.Join(dir, "modules", "sha256", h+".wasm")); err != nil {
		t.Fatal(err)
	}
	srv = start()
	if _, ok := srv.experts.Get("bob.picky"); ok {
		t.Fatal("bob.picky came back without its module")
	}
	if err := srv.Deploy(ctx, ExpertConfig{UID: "alice.ffn.2", Owner: "alice", Module: ModuleBytes(wasmexperts.FFNC), Config: cfg}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "deployments.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ds []struct{ UID string }
	if err := json.Unmarshal(b, &ds); err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, d := range ds {
		uids = append(uids, d.UID)
	}
	if want := []string{"alice.ffn.0", "alice.ffn.2", "bob.picky"}; !slices.Equal(uids, want) {
		t.Errorf("deployments file holds %v, want %v", uids, want)
	}
}

// TestTenantParamBytesCapCoversAllItsExperts gives a tenant a param_bytes
// cap that fits two ffn experts and not three: the third deploy is
// refused with ResourceExhausted naming the cap, before it allocates.
func TestTenantParamBytesCapCoversAllItsExperts(t *testing.T) {
	ctx := context.Background()
	srv := startTenantsServer(t)
	api := moduleAPI{srv}
	alice := rpc.Caller{Tenant: "alice"}
	mod, err := api.Upload(ctx, alice, rpc.ModuleUpload{Size: -1, Body: bytes.NewReader(wasmexperts.FFNC)})
	if err != nil {
		t.Fatal(err)
	}
	deploy := func(uid string) error {
		_, err := api.Deploy(ctx, alice, rpc.Deployment{Experts: uid, Module: mod.Digest,
			Config: map[string]int64{"hidden_dim": 64}, Forward: rpc.AccessPublic, Backward: rpc.AccessOwner})
		return err
	}
	if err := deploy("alice.a"); err != nil {
		t.Fatal(err)
	}
	one := srv.paramBytesOf("alice")
	// Lower alice's cap to 2.5 experts' worth and reload.
	path := srv.tenants.Path()
	if err := tenant.Edit(path, func(f *tenant.File) error {
		return f.SetCaps("alice", tenant.Caps{ParamBytes: one * 5 / 2})
	}); err != nil {
		t.Fatal(err)
	}
	if err := srv.tenants.Reload(); err != nil {
		t.Fatal(err)
	}
	if err := deploy("alice.b"); err != nil {
		t.Fatalf("the second expert fits: %v", err)
	}
	err = deploy("alice.c")
	if errorCodes.Of(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "parameter budget") {
		t.Fatalf("the third expert: %v, want resource exhausted naming the parameter budget", err)
	}
	if _, ok := srv.experts.Get("alice.c"); ok {
		t.Error("the refused expert is served")
	}
	if got := srv.paramBytesOf("alice"); got > one*5/2 {
		t.Errorf("alice holds %d parameter bytes, over her cap of %d", got, one*5/2)
	}
}
