package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
)

// aliceToken is the one token the fake server knows: alice's.
const aliceToken = "alice-token"

// authorize checks a request's Authorization header as the server does:
// alice's token passes, no token passes where anonymous callers may
// call, and anything else is Unauthenticated.
func authorize(h http.Header, anonymous bool) error {
	switch v := h.Get("Authorization"); {
	case v == "Bearer "+aliceToken:
		return nil
	case v == "" && anonymous:
		return nil
	case v == "":
		return connect.NewError(connect.CodeUnauthenticated, errors.New("ModuleService needs a token"))
	}
	return connect.NewError(connect.CodeUnauthenticated, errors.New("the bearer token is not valid on this server"))
}

// received is one upload as the fake server received it.
type received struct {
	name   string
	size   int64 // the declared size_bytes, -1 for none
	bytes  int64 // what the chunks held
	chunks int
}

// fakeModules is a ModuleService built on the generated handler that
// records the requests it receives. Where the CLI's test looks, it
// answers as the server does: the upload cap and the wire's rules for
// chunks, FailedPrecondition for a deployed module, PermissionDenied
// outside alice's prefix.
type fakeModules struct {
	moehostv1connect.UnimplementedModuleServiceHandler
	maxUpload int64

	mu       sync.Mutex
	uploads  []received
	deployed []*moehostv1.DeployExpertRequest
	undeploy []string
	deleted  []string
	mods     []*moehostv1.ModuleInfo
}

// maxChunkBytes is the most one UploadModuleRequest's chunk may carry.
const maxChunkBytes = 1 << 20

func (m *fakeModules) UploadModule(_ context.Context, stream *connect.ClientStream[moehostv1.UploadModuleRequest]) (*connect.Response[moehostv1.UploadModuleResponse], error) {
	if err := authorize(stream.RequestHeader(), false); err != nil {
		return nil, err
	}
	overCap := connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the module exceeds this server's upload cap of %d MiB", m.maxUpload>>20))
	got := received{size: -1}
	h := sha256.New()
	for first := true; stream.Receive(); first = false {
		msg := stream.Msg()
		switch {
		case first:
			got.name = msg.GetName()
			if msg.SizeBytes != nil {
				got.size = msg.GetSizeBytes()
			}
			if got.size > m.maxUpload {
				return nil, overCap
			}
		case msg.GetName() != "" || msg.SizeBytes != nil:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("only the upload's first message may set name or size_bytes"))
		}
		if len(msg.GetChunk()) > maxChunkBytes {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("an upload chunk of %d bytes is larger than %d bytes", len(msg.GetChunk()), maxChunkBytes))
		}
		got.bytes += int64(len(msg.GetChunk()))
		got.chunks++
		if got.bytes > m.maxUpload {
			return nil, overCap
		}
		h.Write(msg.GetChunk())
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	if got.size >= 0 && got.bytes != got.size {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the upload ended after %d of its declared %d bytes", got.bytes, got.size))
	}
	info := &moehostv1.ModuleInfo{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), SizeBytes: got.bytes, Name: got.name}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.uploads = append(m.uploads, got)
	m.mods = append(m.mods, info)
	return connect.NewResponse(&moehostv1.UploadModuleResponse{Module: info}), nil
}

func (m *fakeModules) ListModules(_ context.Context, req *connect.Request[moehostv1.ListModulesRequest]) (*connect.Response[moehostv1.ListModulesResponse], error) {
	if err := authorize(req.Header(), false); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return connect.NewResponse(&moehostv1.ListModulesResponse{Modules: m.mods}), nil
}

func (m *fakeModules) DeleteModule(_ context.Context, req *connect.Request[moehostv1.DeleteModuleRequest]) (*connect.Response[moehostv1.DeleteModuleResponse], error) {
	if err := authorize(req.Header(), false); err != nil {
		return nil, err
	}
	digest := req.Msg.GetDigest()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.deployed {
		if d.GetModuleDigest() == digest {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("module %s runs %s", digest, d.GetExperts()))
		}
	}
	m.deleted = append(m.deleted, digest)
	return connect.NewResponse(&moehostv1.DeleteModuleResponse{}), nil
}

func (m *fakeModules) DeployExpert(_ context.Context, req *connect.Request[moehostv1.DeployExpertRequest]) (*connect.Response[moehostv1.DeployExpertResponse], error) {
	if err := authorize(req.Header(), false); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deployed = append(m.deployed, req.Msg)
	return connect.NewResponse(&moehostv1.DeployExpertResponse{Uids: []string{"alice.ffn.0", "alice.ffn.1"}}), nil
}

func (m *fakeModules) UndeployExpert(_ context.Context, req *connect.Request[moehostv1.UndeployExpertRequest]) (*connect.Response[moehostv1.UndeployExpertResponse], error) {
	if err := authorize(req.Header(), false); err != nil {
		return nil, err
	}
	experts := req.Msg.GetExperts()
	if !strings.HasPrefix(experts, "alice.") {
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%q is not under alice's prefixes", experts))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.undeploy = append(m.undeploy, experts)
	return connect.NewResponse(&moehostv1.UndeployExpertResponse{Uids: []string{experts}}), nil
}

// fakeExperts is an ExpertService that only lists its experts, to
// anonymous callers and alice.
type fakeExperts struct {
	moehostv1connect.UnimplementedExpertServiceHandler
	experts []*moehostv1.ExpertInfo
}

func (e fakeExperts) ListExperts(_ context.Context, req *connect.Request[moehostv1.ListExpertsRequest]) (*connect.Response[moehostv1.ListExpertsResponse], error) {
	if err := authorize(req.Header(), true); err != nil {
		return nil, err
	}
	return connect.NewResponse(&moehostv1.ListExpertsResponse{Experts: e.experts}), nil
}

// moduleServer serves m and two listed experts on a real h2c server.
func moduleServer(t *testing.T, m *fakeModules) string {
	t.Helper()
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	experts := fakeExperts{experts: []*moehostv1.ExpertInfo{
		{Uid: "alice.ffn.0", Owner: "alice", ModuleDigest: "sha256:ab", ParameterCount: 42, Healthy: true},
		{Uid: "ffn.0", ModuleDigest: "sha256:cd", ParameterCount: 7},
	}}
	mux := http.NewServeMux()
	mux.Handle(moehostv1connect.NewModuleServiceHandler(m))
	mux.Handle(moehostv1connect.NewExpertServiceHandler(experts))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = p
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func run(args ...string) (stdout, stderr string, code int) {
	var o, e bytes.Buffer
	code = Main(args, &o, &e)
	return o.String(), e.String(), code
}

// TestModuleCommands drives upload, deploy, undeploy, modules and experts
// against a fake server that records what they send.
func TestModuleCommands(t *testing.T) {
	m := &fakeModules{maxUpload: 2 << 20}
	url := moduleServer(t, m)
	dir := t.TempDir()
	wasm := bytes.Repeat([]byte("\x00asm\x01\x00\x00\x00"), (3<<20)/16+5) // 1.5 MiB: two chunks
	file := filepath.Join(dir, "ffn.wasm")
	if err := os.WriteFile(file, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(wasm)
	digest := "sha256:" + hex.EncodeToString(sum[:])

	// The token comes from the environment unless --token is given.
	t.Setenv(tokenEnv, aliceToken)
	stdout, stderr, code := run("upload", "--server", url, file)
	if code != 0 {
		t.Fatalf("upload: exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if lines[len(lines)-1] != digest {
		t.Errorf("upload printed %q, want the digest %s last", stdout, digest)
	}
	if want := (received{name: "ffn.wasm", size: int64(len(wasm)), bytes: int64(len(wasm)), chunks: 2}); len(m.uploads) != 1 || m.uploads[0] != want {
		t.Errorf("the server saw %+v, want %+v", m.uploads, want)
	}
	if _, stderr, code := run("upload", "--server", url, "--token", "wrong", file); code != 1 || !strings.Contains(stderr, "unauthenticated") {
		t.Errorf("upload with a bad --token: exit %d, %q", code, stderr)
	}
	big := filepath.Join(dir, "big.wasm")
	if err := os.WriteFile(big, make([]byte, 5<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := run("upload", "--server", url, big); code != 1 || !strings.Contains(stderr, "upload cap of 2 MiB") {
		t.Errorf("upload over the cap: exit %d, %q", code, stderr)
	}
	if _, stderr, code := run("upload", "--server", url, filepath.Join(dir, "missing.wasm")); code != 1 || !strings.Contains(stderr, "missing.wasm") {
		t.Errorf("upload of a missing file: exit %d, %q", code, stderr)
	}

	stdout, stderr, code = run("deploy", "--server", url, "--module", digest, "--experts", "alice.ffn.[0:2]",
		"--config", "hidden_dim=64", "--config", "layers=2", "--optimizer", "sgd", "--lr", "0.5", "--momentum", "0.9",
		"--max-batch-size", "32", "--max-wait", "2ms", "--call-timeout", "5s", "--memory-pages", "64",
		"--forward-access", "tenants", "--backward-access", "public")
	if code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, stderr)
	}
	if stdout != "alice.ffn.0\nalice.ffn.1\n" {
		t.Errorf("deploy printed %q", stdout)
	}
	want := &moehostv1.DeployExpertRequest{
		Experts: "alice.ffn.[0:2]", ModuleDigest: digest, Config: map[string]int64{"hidden_dim": 64, "layers": 2},
		Optimizer:     &moehostv1.OptimizerConfig{Name: "sgd", Lr: 0.5, Momentum: 0.9},
		Batching:      &moehostv1.BatchLimits{MaxBatchSize: 32, MaxWait: durationpb.New(2 * time.Millisecond)},
		Limits:        &moehostv1.ExpertLimits{CallTimeout: durationpb.New(5 * time.Second), MemoryPages: 64},
		ForwardAccess: moehostv1.Access_ACCESS_TENANTS, BackwardAccess: moehostv1.Access_ACCESS_PUBLIC,
	}
	if len(m.deployed) != 1 || !proto.Equal(m.deployed[0], want) {
		t.Errorf("the server got %v, want %v", m.deployed, want)
	}
	// Without optimizer, batching, limits or access flags, none are sent:
	// the server's defaults (public Forward, owner-only Backward) apply.
	if _, stderr, code := run("deploy", "--server", url, "--module", digest, "--experts", "alice.x"); code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, stderr)
	}
	if d := m.deployed[1]; d.GetOptimizer() != nil || d.GetForwardAccess() != moehostv1.Access_ACCESS_UNSPECIFIED ||
		d.GetBackwardAccess() != moehostv1.Access_ACCESS_UNSPECIFIED || d.GetBatching() != nil || d.GetLimits() != nil {
		t.Errorf("deploy with defaults sent %v", d)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--module", digest, "--experts", "alice.x", "--backward-access", "anyone"}, "--backward-access"},
		{[]string{"--module", "sha256:nope", "--experts", "alice.x"}, "module digest"},
		{[]string{"--module", digest, "--experts", "alice.x", "--queue-size", "4294967296"}, "--queue-size"},
		{[]string{"--experts", "alice.x"}, `"module" not set`},
	} {
		if _, stderr, code := run(append([]string{"deploy", "--server", url}, tc.args...)...); code != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("deploy %v: exit %d, %q; want %q", tc.args, code, stderr, tc.want)
		}
	}

	stdout, stderr, code = run("undeploy", "--server", url, "alice.ffn.0")
	if code != 0 || stdout != "alice.ffn.0\n" {
		t.Errorf("undeploy: exit %d, %q, %s", code, stdout, stderr)
	}
	if _, stderr, code := run("undeploy", "--server", url, "bob.ffn.0"); code != 1 || !strings.Contains(stderr, "permission_denied") {
		t.Errorf("undeploy of another's: exit %d, %q", code, stderr)
	}

	stdout, _, code = run("modules", "--server", url)
	if want := "DIGEST\tBYTES\tNAME\tEXPERTS\n" + digest + "\t" + fmt.Sprint(len(wasm)) + "\tffn.wasm\t\n"; code != 0 || stdout != want {
		t.Errorf("modules: exit %d, %q, want %q", code, stdout, want)
	}

	other := "sha256:" + strings.Repeat("0", 64)
	if _, stderr, code := run("modules", "delete", "--server", url, other); code != 0 || len(m.deleted) != 1 || m.deleted[0] != other {
		t.Errorf("modules delete: exit %d, %q, deleted %v", code, stderr, m.deleted)
	}
	if _, stderr, code := run("modules", "delete", "--server", url, digest); code != 1 || !strings.Contains(stderr, "failed_precondition: ") {
		t.Errorf("modules delete of a deployed module: exit %d, %q", code, stderr)
	}

	// experts needs no token; without the environment's, it is anonymous.
	t.Setenv(tokenEnv, "")
	stdout, stderr, code = run("experts", "--server", url)
	rows := "alice.ffn.0\talice\tsha256:ab\t42\thealthy\nffn.0\t-\tsha256:cd\t7\tunhealthy\n"
	if want := "UID\tOWNER\tMODULE\tPARAMETERS\tHEALTH\n" + rows; code != 0 || stdout != want {
		t.Errorf("experts: exit %d, %q (%s), want %q", code, stdout, stderr, want)
	}
	if stdout, stderr, code = run("experts", "--no-headers", "--server", url); code != 0 || stdout != rows {
		t.Errorf("experts --no-headers: exit %d, %q (%s), want %q", code, stdout, stderr, rows)
	}
	if _, stderr, code := run("modules", "--server", url); code != 1 || !strings.Contains(stderr, "--token or $MOEHOST_TOKEN") {
		t.Errorf("modules without a token: exit %d, %q", code, stderr)
	}
}

// TestCompileCommand fills a cache with `moehost compile` and checks that
// a server using it finds the module there: it adds no entry of its own.
func TestCompileCommand(t *testing.T) {
	cache := t.TempDir()
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"compile", "--compile-cache", cache, "ffn-c"}, &stdout, &stderr); code != 0 {
		t.Fatalf("compile: exit %d: %s", code, stderr.String())
	}
	entries := func() int {
		ents, err := os.ReadDir(cache)
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	n := entries()
	if n == 0 || !strings.Contains(stdout.String(), "ffn-c\t") {
		t.Fatalf("compile printed %q and left %d cache entries", stdout.String(), n)
	}
	ctx := context.Background()
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()), host.WithCompileCache(cache),
		host.WithExperts(host.ExpertConfig{UID: "f.0", Module: host.ModuleBytes(wasmexperts.FFNC), Config: map[string]int64{"hidden_dim": 4}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown(ctx)
	if got := entries(); got != n {
		t.Errorf("the server's cache has %d entries after its start, %d after moehost compile: it compiled again", got, n)
	}
	if code := Main([]string{"compile", "--compile-cache", cache, "no-such-module"}, &stdout, &stderr); code == 0 {
		t.Error("compile of an unknown module succeeded")
	}
}
