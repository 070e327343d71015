package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
)

// lockedBuffer is a bytes.Buffer that the server's goroutines may log to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestStartupLogSaysWhatIsServed checks the "moehost serving" line: uids,
// module and digest, config, device, data dir and address.
func TestStartupLogSaysWhatIsServed(t *testing.T) {
	ctx := context.Background()
	var buf lockedBuffer
	dataDir := t.TempDir()
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(dataDir),
		host.WithLogger(slog.New(slog.NewJSONHandler(&buf, nil))),
		host.WithExperts(
			host.ExpertConfig{UID: "nop.0", Module: host.NamedModuleBytes("nop", wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}},
			host.ExpertConfig{UID: "nop.1", Module: host.NamedModuleBytes("nop", wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}},
		))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(ctx)
	var line map[string]any
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, `"moehost serving"`) {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line == nil {
		t.Fatalf("no startup line in:\n%s", buf.String())
	}
	want := map[string]string{
		"addr":     srv.Addr(),
		"experts":  "nop.0,nop.1",
		"modules":  "module nop sha256:",
		"config":   "hidden_dim=4",
		"device":   "cpu",
		"data_dir": dataDir,
	}
	for k, v := range want {
		if got, _ := line[k].(string); !strings.Contains(got, v) {
			t.Errorf("%s = %q, want it to contain %q", k, got, v)
		}
	}
}
