package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
)

// TestModuleCommandsEndToEnd drives `moehost upload|deploy|experts|
// modules|undeploy` against `moehost serve --tenants` with two tenants:
// the whole path from a .wasm file to a served expert and back, and the
// refusals a tenant meets on the other's experts.
func TestModuleCommandsEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := buildMoehost(t, dir)
	tenants := filepath.Join(dir, "tenants.json")
	addTenant := func(name string) string {
		out, err := exec.Command(bin, "tenant", "add", name, "--prefix", name, "--tenants", tenants).Output()
		if err != nil {
			t.Fatalf("tenant add %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	alice, bob := addTenant("alice"), addTenant("bob")
	cmd, addr := startServe(t, bin, "--data-dir", filepath.Join(dir, "data"), "--experts", "ffn.0", "--module", "nop",
		"--hidden-dim", "4", "--no-dht", "--max-wait", "0s", "--tenants", tenants)
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	server := "http://" + addr

	// run runs a command with token in MOEHOST_TOKEN and returns its
	// stdout, its stderr and whether it succeeded.
	run := func(token string, args ...string) (string, string, bool) {
		t.Helper()
		c := exec.Command(bin, append(args, "--server", server)...)
		c.Env = append(os.Environ(), "MOEHOST_TOKEN="+token)
		var stdout, stderr strings.Builder
		c.Stdout, c.Stderr = &stdout, &stderr
		err := c.Run()
		return stdout.String(), stderr.String(), err == nil
	}
	must := func(token string, args ...string) string {
		t.Helper()
		out, errOut, ok := run(token, args...)
		if !ok {
			t.Fatalf("moehost %v: %s", args, errOut)
		}
		return out
	}
	refused := func(token, code string, args ...string) {
		t.Helper()
		if _, errOut, ok := run(token, args...); ok || !strings.Contains(errOut, code+": ") {
			t.Errorf("moehost %v: ok %v, %q; want %s", args, ok, errOut, code)
		}
	}

	wasmFile := filepath.Join("..", "examples", "wasm-experts", "ffn", "ffn.wasm")
	wasm, err := os.ReadFile(wasmFile)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(wasm)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	out := must(alice, "upload", wasmFile)
	if lines := strings.Split(strings.TrimSpace(out), "\n"); lines[len(lines)-1] != digest {
		t.Fatalf("upload printed %q, want the digest %s last", out, digest)
	}
	refused("nope", "unauthenticated", "upload", wasmFile)
	refused("nope", "unauthenticated", "experts") // a given token must be valid, even where none is needed
	if out := must(alice, "deploy", "--module", digest, "--experts", "alice.ffn.[0:2]", "--config", "hidden_dim=4"); out != "alice.ffn.0\nalice.ffn.1\n" {
		t.Errorf("deploy printed %q", out)
	}
	// bob can neither see alice's module nor deploy it, nor deploy under
	// her prefix, nor undeploy her experts.
	const modulesHeader = "DIGEST\tBYTES\tNAME\tEXPERTS\n"
	if out := must(bob, "modules"); out != modulesHeader {
		t.Errorf("bob's modules: %q", out)
	}
	refused(bob, "not_found", "deploy", "--module", digest, "--experts", "bob.ffn.0", "--config", "hidden_dim=4")
	refused(bob, "permission_denied", "undeploy", "alice.ffn.0")

	out = must("", "experts")
	for _, want := range []string{"alice.ffn.0\talice\t" + digest + "\t", "alice.ffn.1\talice\t" + digest + "\t", "ffn.0\t-\t"} {
		if !strings.Contains(out, want) {
			t.Errorf("experts printed %q, want a line starting %q", out, want)
		}
	}
	if !strings.HasPrefix(out, "UID\tOWNER\tMODULE\tPARAMETERS\tHEALTH\n") {
		t.Errorf("experts printed %q, want a header row first", out)
	}
	if out := must(alice, "modules"); out != modulesHeader+digest+"\t"+strconv.Itoa(len(wasm))+"\tffn.wasm\talice.ffn.0,alice.ffn.1\n" {
		t.Errorf("alice's modules: %q", out)
	}

	// Forward is public by default; Backward is the owner's.
	expertClient := func(token string) moehostv1connect.ExpertServiceClient {
		return moehostv1connect.NewExpertServiceClient(http.DefaultClient, server, connect.WithInterceptors(withBearer(token)))
	}
	x := f32Tensor([]int64{1, 4}, []float32{1, 2, 3, 4})
	ctx := context.Background()
	if _, err := expertClient("").Forward(ctx, connect.NewRequest(&moehostv1.ForwardRequest{Uid: "alice.ffn.0", Inputs: []*moehostv1.Tensor{x}})); err != nil {
		t.Errorf("anonymous Forward: %v", err)
	}
	bwd := &moehostv1.BackwardRequest{Uid: "alice.ffn.0", Inputs: []*moehostv1.Tensor{x}, GradOutputs: []*moehostv1.Tensor{x}}
	for token, want := range map[string]connect.Code{"": connect.CodeUnauthenticated, bob: connect.CodePermissionDenied, alice: 0} {
		_, err := expertClient(token).Backward(ctx, connect.NewRequest(bwd))
		if connect.CodeOf(err) != want && !(want == 0 && err == nil) {
			t.Errorf("Backward with token %q: %v, want %v", token, err, want)
		}
	}

	refused(alice, "failed_precondition", "modules", "delete", digest)
	if out := must(alice, "undeploy", "alice.ffn.[0:2]"); out != "alice.ffn.0\nalice.ffn.1\n" {
		t.Errorf("undeploy printed %q", out)
	}
	must(alice, "modules", "delete", digest)
	if out := must(alice, "modules", "--no-headers"); out != "" {
		t.Errorf("alice's modules after delete: %q", out)
	}
	if out := must("", "experts"); strings.Contains(out, "alice.") {
		t.Errorf("experts after undeploy: %q", out)
	}
}

// withBearer sets a bearer token on unary calls, when there is one.
type withBearer string

func (w withBearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if w != "" {
			req.Header().Set("Authorization", "Bearer "+string(w))
		}
		return next(ctx, req)
	}
}

func (withBearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (withBearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
