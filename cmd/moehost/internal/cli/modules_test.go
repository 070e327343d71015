package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/host/rpc"
)

// tenantAuth knows one tenant, alice.
type tenantAuth struct{}

func (tenantAuth) Authenticate(token string) (rpc.Caller, bool) {
	if token == "alice-token" {
		return rpc.Caller{Tenant: "alice"}, true
	}
	return rpc.Caller{}, false
}

// recordingModules is a Modules that hashes uploads and records requests.
type recordingModules struct {
	mu       sync.Mutex
	uploads  []rpc.ModuleUpload
	deployed []rpc.Deployment
	undeploy []string
	deleted  []string
	mods     []rpc.ModuleInfo
}

func (m *recordingModules) Upload(_ context.Context, c rpc.Caller, u rpc.ModuleUpload) (rpc.ModuleInfo, error) {
	h := sha256.New()
	n, err := io.Copy(h, u.Body)
	if err != nil {
		return rpc.ModuleInfo{}, err
	}
	info := rpc.ModuleInfo{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: n, Name: u.Name}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.uploads = append(m.uploads, rpc.ModuleUpload{Name: u.Name, Size: u.Size})
	m.mods = append(m.mods, info)
	return info, nil
}

func (m *recordingModules) List(context.Context, rpc.Caller) ([]rpc.ModuleInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mods, nil
}

func (m *recordingModules) Delete(_ context.Context, _ rpc.Caller, digest string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.deployed {
		if d.Module == digest {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("module %s runs %s", digest, d.Experts))
		}
	}
	m.deleted = append(m.deleted, digest)
	return nil
}

func (m *recordingModules) Deploy(_ context.Context, _ rpc.Caller, d rpc.Deployment) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.deployed = append(m.deployed, d)
	return []string{"alice.ffn.0", "alice.ffn.1"}, nil
}

func (m *recordingModules) Undeploy(_ context.Context, c rpc.Caller, experts string) ([]string, error) {
	if !strings.HasPrefix(experts, c.Tenant+".") {
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%q is not under %s's prefixes", experts, c.Tenant))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.undeploy = append(m.undeploy, experts)
	return []string{experts}, nil
}

// listedExpert is an expert that only describes itself.
type listedExpert struct{ info *moehostv1.ExpertInfo }

func (e listedExpert) Info() *moehostv1.ExpertInfo               { return e.info }
func (listedExpert) Schema() (in, out []*moehostv1.TensorSchema) { return nil, nil }
func (listedExpert) Device() gpuhost.Device                      { return nil }
func (listedExpert) Forward(context.Context, []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	return nil, connect.NewError(connect.CodeUnavailable, nil)
}
func (listedExpert) Backward(context.Context, []*gpuhost.Tensor, []*gpuhost.Tensor) ([]*gpuhost.Tensor, error) {
	return nil, connect.NewError(connect.CodeUnavailable, nil)
}

type listedExperts []rpc.Expert

func (l listedExperts) Expert(uid string) (rpc.Expert, bool) { return nil, false }
func (l listedExperts) All() []rpc.Expert                    { return l }

// moduleServer serves ModuleService with m on a real h2c server.
func moduleServer(t *testing.T, m rpc.Modules, maxUpload int64) string {
	t.Helper()
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	experts := listedExperts{
		listedExpert{&moehostv1.ExpertInfo{Uid: "alice.ffn.0", Owner: "alice", ModuleDigest: "sha256:ab", ParameterCount: 42, Healthy: true}},
		listedExpert{&moehostv1.ExpertInfo{Uid: "ffn.0", ModuleDigest: "sha256:cd", ParameterCount: 7}},
	}
	srv := httptest.NewUnstartedServer(rpc.NewHandler(experts, rpc.Options{Auth: tenantAuth{}, Modules: m, MaxUploadBytes: maxUpload}))
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
// against a server with a recording Modules.
func TestModuleCommands(t *testing.T) {
	m := &recordingModules{}
	url := moduleServer(t, m, 2<<20)
	dir := t.TempDir()
	wasm := bytes.Repeat([]byte("\x00asm\x01\x00\x00\x00"), (3<<20)/16+5) // 1.5 MiB: two chunks
	file := filepath.Join(dir, "ffn.wasm")
	if err := os.WriteFile(file, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(wasm)
	digest := "sha256:" + hex.EncodeToString(sum[:])

	// The token comes from the environment unless --token is given.
	t.Setenv(tokenEnv, "alice-token")
	stdout, stderr, code := run("upload", "--server", url, file)
	if code != 0 {
		t.Fatalf("upload: exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if lines[len(lines)-1] != digest {
		t.Errorf("upload printed %q, want the digest %s last", stdout, digest)
	}
	if want := (rpc.ModuleUpload{Name: "ffn.wasm", Size: int64(len(wasm))}); len(m.uploads) != 1 || m.uploads[0] != want {
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
	want := rpc.Deployment{
		Experts: "alice.ffn.[0:2]", Module: digest, Config: map[string]int64{"hidden_dim": 64, "layers": 2},
		Optimizer: &rpc.OptimizerConfig{Name: "sgd", LR: 0.5, Momentum: 0.9},
		Batching:  rpc.BatchLimits{MaxBatchSize: 32, MaxWait: 2 * time.Millisecond},
		Limits:    rpc.ExpertLimits{CallTimeout: 5 * time.Second, MemoryPages: 64},
		Forward:   rpc.AccessTenants, Backward: rpc.AccessPublic,
	}
	if len(m.deployed) != 1 || !reflect.DeepEqual(m.deployed[0], want) {
		t.Errorf("the server got %+v, want %+v", m.deployed, want)
	}
	// Without optimizer flags, no optimizer: the server's default.
	if _, stderr, code := run("deploy", "--server", url, "--module", digest, "--experts", "alice.x"); code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, stderr)
	}
	if d := m.deployed[1]; d.Optimizer != nil || d.Forward != rpc.AccessPublic || d.Backward != rpc.AccessOwner || d.Batching != (rpc.BatchLimits{}) {
		t.Errorf("deploy with defaults sent %+v", d)
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
