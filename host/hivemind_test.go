package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
)

// TestHivemindRefusesUIDs: a uid a hivemind client could not find is
// refused at New, naming the grammar.
func TestHivemindRefusesUIDs(t *testing.T) {
	t.Parallel()
	for _, uid := range []string{"ffn", "ffn.01", "ffn.x"} {
		_, err := New(WithHivemind(HivemindConfig{}), WithExperts(ExpertConfig{UID: uid, Module: ModuleBytes(wasmexperts.FFN)}))
		if err == nil || !strings.Contains(err.Error(), "not a hivemind expert uid") {
			t.Errorf("uid %q: err = %v", uid, err)
		}
	}
	if _, err := New(WithHivemind(HivemindConfig{}), WithExperts(ExpertConfig{UID: "ffn.0.3", Module: ModuleBytes(wasmexperts.FFN)})); err != nil {
		t.Errorf("ffn.0.3: %v", err)
	}
}

// TestHivemindAddrsBeforeReady: the multiaddrs are on disk once Start
// returns, and match the node's.
func TestHivemindAddrsBeforeReady(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	srv := startTestServer(t, WithDataDir(dir), WithHivemind(HivemindConfig{}),
		WithExperts(ExpertConfig{UID: "ffn.0", Module: ModuleBytes(wasmexperts.FFN), Config: map[string]int64{"hidden_dim": 8}}))
	b, err := os.ReadFile(filepath.Join(dir, "hivemind-addrs"))
	if err != nil {
		t.Fatal(err)
	}
	got, want := strings.Fields(string(b)), srv.HivemindAddrs()
	if len(want) == 0 || strings.Join(got, " ") != strings.Join(want, " ") || !strings.HasPrefix(want[0], "/ip4/127.0.0.1/tcp/") || !strings.Contains(want[0], "/p2p/") {
		t.Fatalf("hivemind-addrs %q, node %q", got, want)
	}
}
