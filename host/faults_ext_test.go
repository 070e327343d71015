package host_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/gen/moehost/v1/moehostv1connect"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/host/tenant"
)

// TestFaultsBlameTheirParty uploads and deploys faulty modules and
// requests through the real ModuleService of a server with tenants, and
// checks that a guest's or a caller's fault is InvalidArgument or
// FailedPrecondition, never Internal (which is for host bugs): a trap in
// moe_init, a wrong ABI version, hidden_dim=0, a WASI command module, a
// 308-byte uid.
func TestFaultsBlameTheirParty(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var f tenant.File
	token, err := f.Add("alice", []string{"alice"}, tenant.Caps{})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(file, f.Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(filepath.Join(dir, "data")), host.WithTenants(file),
		host.WithCheckpoints(host.CheckpointConfig{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	mc := moehostv1connect.NewModuleServiceClient(http.DefaultClient, "http://"+srv.Addr())
	authed := func(h http.Header) { h.Set("Authorization", "Bearer "+token) }
	upload := func(wasm []byte) (string, error) {
		stream := mc.UploadModule(ctx)
		authed(stream.RequestHeader())
		if err := stream.Send(&moehostv1.UploadModuleRequest{Chunk: wasm}); err != nil {
			t.Logf("send: %v", err)
		}
		res, err := stream.CloseAndReceive()
		if err != nil {
			return "", err
		}
		return res.Msg.GetModule().GetDigest(), nil
	}
	// deploy uploads wasm and deploys it as uid, and returns the first
	// error.
	deploy := func(wasm []byte, uid string, cfg map[string]int64) error {
		digest, err := upload(wasm)
		if err != nil {
			return err
		}
		req := connect.NewRequest(&moehostv1.DeployExpertRequest{Experts: uid, ModuleDigest: digest, Config: cfg})
		authed(req.Header())
		_, err = mc.DeployExpert(ctx, req)
		return err
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("internal", "sandbox", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ffn := map[string]int64{"hidden_dim": 8}
	for _, c := range []struct {
		name string
		wasm []byte
		uid  string
		cfg  map[string]int64
		msg  string
	}{
		{"a trap in moe_init", read("bad_init_trap.wasm"), "alice.trap.0", nil, "moe_init"},
		{"a wrong ABI version", read("bad_version.wasm"), "alice.version.0", nil, "ABI version"},
		{"hidden_dim=0", wasmexperts.FFNC, "alice.zero.0", map[string]int64{"hidden_dim": 0}, "hidden_dim"},
		{"a WASI command", read("bad_command.wasm"), "alice.command.0", nil, "command"},
		{"a 308-byte uid", wasmexperts.FFNC, "alice." + strings.Repeat("x", 302), ffn, "uid"},
	} {
		err := deploy(c.wasm, c.uid, c.cfg)
		if code := connect.CodeOf(err); code != connect.CodeInvalidArgument && code != connect.CodeFailedPrecondition ||
			!strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want InvalidArgument or FailedPrecondition naming %q", c.name, err, c.msg)
		}
	}
	// The server still serves a good module afterwards.
	if err := deploy(wasmexperts.FFNC, "alice.ffn.0", ffn); err != nil {
		t.Errorf("a good module after the faults: %v", err)
	}
}
