package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/host/tenant"
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

// TestStartupWarnsWhenNobodyCanTrain checks the warning that the
// operator's experts cannot be trained under tenants without an admin
// token, and that it names both ways out; and that it is absent when
// one of them is taken, or there are no tenants.
func TestStartupWarnsWhenNobodyCanTrain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var f tenant.File
	if _, err := f.Add("alice", []string{"alice"}, tenant.Caps{}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "tenants.json")
	if err := os.WriteFile(file, f.Marshal(), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		opts []host.Option
		warn bool
	}{
		{"tenants, no admin token", []host.Option{host.WithTenants(file)}, true},
		{"tenants and an admin token", []host.Option{host.WithTenants(file), host.WithAdminToken("s3cret")}, false},
		{"tenants and public backward", []host.Option{host.WithTenants(file), host.WithPublicBackward(true)}, false},
		{"no tenants", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var buf lockedBuffer
			opts := append([]host.Option{host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
				host.WithLogger(slog.New(slog.NewJSONHandler(&buf, nil))),
				host.WithExperts(host.ExpertConfig{UID: "nop.0", Module: host.NamedModuleBytes("nop", wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}}),
			}, tt.opts...)
			srv, err := host.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown(ctx)
			var warned map[string]any
			for _, l := range strings.Split(buf.String(), "\n") {
				if strings.Contains(l, "nobody can train") {
					if err := json.Unmarshal([]byte(l), &warned); err != nil {
						t.Fatal(err)
					}
				}
			}
			if !tt.warn {
				if warned != nil {
					t.Fatalf("warned: %v", warned)
				}
				return
			}
			if warned == nil {
				t.Fatalf("no warning in:\n%s", buf.String())
			}
			fix, _ := warned["fix"].(string)
			if warned["level"] != "WARN" || !strings.Contains(fix, "--admin-token") || !strings.Contains(fix, "--public-backward") || warned["experts"] != 1.0 {
				t.Errorf("warning %v: want level WARN, a fix naming --admin-token and --public-backward, and experts 1", warned)
			}
		})
	}
}
