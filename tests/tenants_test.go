package tests

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// tenantsHost is a `moehost serve --tenants` process and its clients.
type tenantsHost struct {
	cmd     *exec.Cmd
	url     string
	modules moehostv1connect.ModuleServiceClient
	experts moehostv1connect.ExpertServiceClient
}

// startTenantsHost serves the operator's ffn.0 (the C ffn) and the
// tenants of file from dataDir.
func startTenantsHost(t testing.TB, bin, dataDir, file string) *tenantsHost {
	t.Helper()
	cmd, addr := startServe(t, bin, "--data-dir", dataDir, "--tenants", file, "--no-dht",
		"--experts", "ffn.0", "--module", "ffn-c", "--hidden-dim", "8", "--max-upload-bytes", "8388608")
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	url := "http://" + addr
	return &tenantsHost{
		cmd: cmd, url: url,
		modules: moehostv1connect.NewModuleServiceClient(http.DefaultClient, url),
		experts: moehostv1connect.NewExpertServiceClient(http.DefaultClient, url),
	}
}

// addTenant adds a tenant with `moehost tenant add` and returns its token.
func addTenant(t testing.TB, bin, file, name string, prefixes ...string) string {
	t.Helper()
	args := []string{"tenant", "add", name, "--tenants", file}
	for _, p := range prefixes {
		args = append(args, "--prefix", p)
	}
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatalf("moehost %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// authed returns req with token as its bearer token.
func authed[T any](token string, msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	if token != "" {
		req.Header().Set("Authorization", "Bearer "+token)
	}
	return req
}

// upload streams wasm to the server in 1 MiB chunks as token.
func (h *tenantsHost) upload(ctx context.Context, token string, wasm []byte) (string, error) {
	stream := h.modules.UploadModule(ctx)
	if token != "" {
		stream.RequestHeader().Set("Authorization", "Bearer "+token)
	}
	for off := 0; off == 0 || off < len(wasm); off += 1 << 20 {
		chunk := wasm[off:min(off+1<<20, len(wasm))]
		if err := stream.Send(&moehostv1.UploadModuleRequest{Chunk: chunk}); err != nil {
			break // the server answered early; CloseAndReceive says why
		}
	}
	res, err := stream.CloseAndReceive()
	if err != nil {
		return "", err
	}
	return res.Msg.GetModule().GetDigest(), nil
}

func (h *tenantsHost) deploy(ctx context.Context, token string, req *moehostv1.DeployExpertRequest) ([]string, error) {
	res, err := h.modules.DeployExpert(ctx, authed(token, req))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetUids(), nil
}

// deployAliceFFN uploads the C ffn as the tenant of token, deploys it as
// alice.ffn.0 (hidden 8), and returns its first answer, against which the
// attack tests check every later one byte for byte.
func (h *tenantsHost) deployAliceFFN(ctx context.Context, t testing.TB, token string) []byte {
	t.Helper()
	digest, err := h.upload(ctx, token, wasmexperts.FFNC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.deploy(ctx, token, &moehostv1.DeployExpertRequest{Experts: "alice.ffn.0", ModuleDigest: digest,
		Config: map[string]int64{"hidden_dim": 8}}); err != nil {
		t.Fatal(err)
	}
	want, err := h.forward(ctx, token, "alice.ffn.0")
	if err != nil {
		t.Fatal(err)
	}
	return want
}

func (h *tenantsHost) forward(ctx context.Context, token, uid string) ([]byte, error) {
	x := f32Tensor([]int64{1, 8}, []float32{1, -2, 3, -4, 5, -6, 7, -8})
	res, err := h.experts.Forward(ctx, authed(token, &moehostv1.ForwardRequest{Uid: uid, Inputs: []*moehostv1.Tensor{x}}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetOutputs()[0].GetData(), nil
}

// wantCode fails unless err has code.
func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

// TestTenantsIsolation runs a real server with two tenants and checks
// every cross-tenant operation is refused with PermissionDenied, a bad or
// missing token with Unauthenticated, a removed token stops working after
// SIGHUP, and modules and deployments come back after a restart with the
// same digests and uids.
func TestTenantsIsolation(t *testing.T) {
	ctx := context.Background()
	bin := buildMoehost(t, "")
	dataDir := t.TempDir()
	file := filepath.Join(dataDir, "tenants.json")
	alice := addTenant(t, bin, file, "alice", "alice")
	bob := addTenant(t, bin, file, "bob", "bob")
	h := startTenantsHost(t, bin, dataDir, file)

	// Alice uploads the C ffn and deploys two experts; Bob uploads the
	// same bytes (shared storage, not visibility) and deploys one.
	digest, err := h.upload(ctx, alice, wasmexperts.FFNC)
	if err != nil {
		t.Fatal(err)
	}
	again, err := h.upload(ctx, alice, wasmexperts.FFNC)
	if err != nil || again != digest {
		t.Fatalf("uploading twice: %q, %v; want %q", again, err, digest)
	}
	cfg := map[string]int64{"hidden_dim": 8}
	uids, err := h.deploy(ctx, alice, &moehostv1.DeployExpertRequest{Experts: "alice.ffn.[0:2]", ModuleDigest: digest, Config: cfg,
		ForwardAccess: moehostv1.Access_ACCESS_OWNER})
	if err != nil || !slices.Equal(uids, []string{"alice.ffn.0", "alice.ffn.1"}) {
		t.Fatalf("alice's deploy: %v, %v", uids, err)
	}
	if _, err := h.forward(ctx, alice, "alice.ffn.0"); err != nil {
		t.Fatalf("alice calls her own expert: %v", err)
	}
	if _, err := h.forward(ctx, "", "ffn.0"); err != nil {
		t.Fatalf("anyone calls the operator's public expert: %v", err)
	}

	// Cross-tenant operations.
	list, err := h.modules.ListModules(ctx, authed(bob, &moehostv1.ListModulesRequest{}))
	if err != nil || len(list.Msg.GetModules()) != 0 {
		t.Errorf("bob lists modules: %v, %v; want none of alice's", list, err)
	}
	_, err = h.modules.DeleteModule(ctx, authed(bob, &moehostv1.DeleteModuleRequest{Digest: digest}))
	wantCode(t, "bob deletes alice's module", err, connect.CodeNotFound)
	_, err = h.deploy(ctx, bob, &moehostv1.DeployExpertRequest{Experts: "bob.ffn.0", ModuleDigest: digest, Config: cfg})
	wantCode(t, "bob deploys alice's module", err, connect.CodeNotFound)
	bobDigest, err := h.upload(ctx, bob, wasmexperts.FFNC)
	if err != nil || bobDigest != digest {
		t.Fatalf("bob uploads the same bytes: %q, %v", bobDigest, err)
	}
	_, err = h.deploy(ctx, bob, &moehostv1.DeployExpertRequest{Experts: "alice.ffn.5", ModuleDigest: digest, Config: cfg})
	wantCode(t, "bob deploys into alice's prefix", err, connect.CodePermissionDenied)
	_, err = h.deploy(ctx, bob, &moehostv1.DeployExpertRequest{Experts: "alice.ffn.0", ModuleDigest: digest, Config: cfg})
	wantCode(t, "bob deploys over alice's uid", err, connect.CodePermissionDenied)
	_, err = h.deploy(ctx, alice, &moehostv1.DeployExpertRequest{Experts: "ffn.0", ModuleDigest: digest, Config: cfg})
	wantCode(t, "alice deploys over the operator's uid", err, connect.CodePermissionDenied)
	_, err = h.deploy(ctx, alice, &moehostv1.DeployExpertRequest{Experts: "alicex.ffn.0", ModuleDigest: digest, Config: cfg})
	wantCode(t, "alice deploys under alicex", err, connect.CodePermissionDenied)
	_, err = h.modules.UndeployExpert(ctx, authed(bob, &moehostv1.UndeployExpertRequest{Experts: "alice.ffn.0"}))
	wantCode(t, "bob undeploys alice's expert", err, connect.CodePermissionDenied)
	_, err = h.forward(ctx, bob, "alice.ffn.0")
	wantCode(t, "bob calls alice's owner-only expert", err, connect.CodePermissionDenied)
	_, err = h.forward(ctx, "", "alice.ffn.0")
	wantCode(t, "an anonymous call of alice's owner-only expert", err, connect.CodeUnauthenticated)
	_, err = h.experts.Info(ctx, authed(bob, &moehostv1.InfoRequest{Uid: "alice.ffn.0"}))
	wantCode(t, "bob reads the info of alice's owner-only expert", err, connect.CodePermissionDenied)
	for _, who := range []string{bob, ""} {
		if served := h.listExperts(ctx, t, who); !slices.Equal(served, []string{"ffn.0@"}) {
			t.Errorf("experts listed to %q: %v; want only the operator's public one", who, served)
		}
	}
	if _, err := h.deploy(ctx, bob, &moehostv1.DeployExpertRequest{Experts: "bob.ffn.0", ModuleDigest: digest, Config: cfg}); err != nil {
		t.Fatalf("bob deploys his own upload: %v", err)
	}
	// Backward is owner-only by default.
	x := f32Tensor([]int64{1, 8}, make([]float32, 8))
	_, err = h.experts.Backward(ctx, authed(alice, &moehostv1.BackwardRequest{Uid: "bob.ffn.0", Inputs: []*moehostv1.Tensor{x}, GradOutputs: []*moehostv1.Tensor{x}}))
	wantCode(t, "alice trains bob's expert", err, connect.CodePermissionDenied)

	// Tokens.
	_, err = h.modules.ListModules(ctx, authed("", &moehostv1.ListModulesRequest{}))
	wantCode(t, "no token", err, connect.CodeUnauthenticated)
	_, err = h.modules.ListModules(ctx, authed("moe_"+strings.Repeat("A", 43), &moehostv1.ListModulesRequest{}))
	wantCode(t, "a token nobody holds", err, connect.CodeUnauthenticated)
	_, err = h.upload(ctx, "moe_bad", wasmexperts.FFNC)
	wantCode(t, "an upload with a bad token", err, connect.CodeUnauthenticated)

	// Deleting a deployed module is refused; undeploy first.
	_, err = h.modules.DeleteModule(ctx, authed(alice, &moehostv1.DeleteModuleRequest{Digest: digest}))
	wantCode(t, "alice deletes her deployed module", err, connect.CodeFailedPrecondition)

	// A restart brings the modules and deployments back.
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	h.cmd.Wait()
	h = startTenantsHost(t, bin, dataDir, file)
	list, err = h.modules.ListModules(ctx, authed(alice, &moehostv1.ListModulesRequest{}))
	if err != nil || len(list.Msg.GetModules()) != 1 || list.Msg.GetModules()[0].GetDigest() != digest ||
		!slices.Equal(list.Msg.GetModules()[0].GetExperts(), []string{"alice.ffn.0", "alice.ffn.1"}) {
		t.Fatalf("alice's modules after a restart: %v, %v", list, err)
	}
	if served := h.listExperts(ctx, t, alice); !slices.Equal(served, []string{"alice.ffn.0@alice", "alice.ffn.1@alice", "bob.ffn.0@bob", "ffn.0@"}) {
		t.Errorf("served after a restart, as alice sees it: %v", served)
	}
	if _, err := h.forward(ctx, alice, "alice.ffn.1"); err != nil {
		t.Errorf("alice's expert after a restart: %v", err)
	}

	// Removing bob from the file and sending SIGHUP stops his token.
	if out, err := exec.Command(bin, "tenant", "remove", "bob", "--tenants", file).CombinedOutput(); err != nil {
		t.Fatalf("tenant remove: %v\n%s", err, out)
	}
	if _, err := h.modules.ListModules(ctx, authed(bob, &moehostv1.ListModulesRequest{})); err != nil {
		t.Fatalf("bob before SIGHUP: %v", err)
	}
	if err := h.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := h.modules.ListModules(ctx, authed(bob, &moehostv1.ListModulesRequest{}))
		if connect.CodeOf(err) == connect.CodeUnauthenticated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bob's token after SIGHUP: %v, want unauthenticated", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := h.modules.ListModules(ctx, authed(alice, &moehostv1.ListModulesRequest{})); err != nil {
		t.Errorf("alice after bob's removal: %v", err)
	}
	if h.cmd.ProcessState != nil {
		t.Fatal("the server exited")
	}
}

// TestHostileUploads sends the module bombs of the sandbox suite and
// other bad uploads through the real API: each gets a clear error, the
// host stays up, and another tenant's expert answers the same throughout.
func TestHostileUploads(t *testing.T) {
	ctx := context.Background()
	bin := buildMoehost(t, "")
	dataDir := t.TempDir()
	file := filepath.Join(dataDir, "tenants.json")
	alice := addTenant(t, bin, file, "alice", "alice")
	mallory := addTenant(t, bin, file, "mallory", "mallory")
	h := startTenantsHost(t, bin, dataDir, file)
	want := h.deployAliceFFN(ctx, t, alice)
	check := func(after string) {
		t.Helper()
		got, err := h.forward(ctx, alice, "alice.ffn.0")
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("alice's expert after %s: %v", after, err)
		}
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("..", "host", "internal", "sandbox", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	big := make([]byte, 100<<20)
	copy(big, "\x00asm\x01\x00\x00\x00")
	tests := []struct {
		name string
		wasm []byte
		code connect.Code
		msg  string
	}{
		{"a 10M-element table", read("hostile_big_table.wasm"), connect.CodeInvalidArgument, "table 0 elements"},
		{"table.grow", read("hostile_table_grow.wasm"), connect.CodeInvalidArgument, "reference-types"},
		{"a path_open import", read("hostile_wasi.wasm"), connect.CodeInvalidArgument, "path_open"},
		{"bad magic", []byte("\x7fELF\x02\x01\x01\x00 not wasm at all"), connect.CodeInvalidArgument, "not a WebAssembly binary"},
		{"truncated", wasmexperts.FFNC[:len(wasmexperts.FFNC)/2], connect.CodeInvalidArgument, ""},
		{"100 MB", big, connect.CodeResourceExhausted, "8 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.upload(ctx, mallory, tt.wasm)
			if connect.CodeOf(err) != tt.code || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("got %v; want %v with %q", err, tt.code, tt.msg)
			}
			t.Logf("%v", err)
			check(tt.name)
		})
	}
	list, err := h.modules.ListModules(ctx, authed(mallory, &moehostv1.ListModulesRequest{}))
	if err != nil || len(list.Msg.GetModules()) != 0 {
		t.Errorf("mallory's refused uploads were kept: %v, %v", list, err)
	}

	// The runtime bombs of the sandbox suite come in a valid module.
	hd, err := h.upload(ctx, mallory, read("hostile.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.deploy(ctx, mallory, &moehostv1.DeployExpertRequest{Experts: "mallory.h.0", ModuleDigest: hd}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		x    []float32
		code connect.Code
	}{
		{"a 4 TiB matmul", []float32{1, 0}, connect.CodeResourceExhausted},
		{"tiny tensors", []float32{3, 0}, connect.CodeResourceExhausted},
		{"deep recursion", []float32{5, 0}, connect.CodeFailedPrecondition},
		{"a trap", []float32{99, 0}, connect.CodeFailedPrecondition},
	} {
		x := f32Tensor([]int64{1, 2}, c.x)
		_, err := h.experts.Forward(ctx, authed(mallory, &moehostv1.ForwardRequest{Uid: "mallory.h.0", Inputs: []*moehostv1.Tensor{x}}))
		if connect.CodeOf(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
		check(c.name)
	}
	var ce *connect.Error
	if _, err := h.forward(ctx, alice, "mallory.x"); !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound {
		t.Errorf("an expert never deployed: %v", err)
	}
}

// listExperts returns ListExperts as token sees it, as uid@owner.
func (h *tenantsHost) listExperts(ctx context.Context, t *testing.T, token string) []string {
	t.Helper()
	res, err := h.experts.ListExperts(ctx, authed(token, &moehostv1.ListExpertsRequest{}))
	if err != nil {
		t.Fatalf("ListExperts: %v", err)
	}
	var served []string
	for _, e := range res.Msg.GetExperts() {
		served = append(served, e.GetUid()+"@"+e.GetOwner())
	}
	return served
}
