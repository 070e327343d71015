package dht_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host"
)

// TestOneNodeShutdownLogsNoWithdrawError shuts down a server whose DHT
// node has no peer: withdrawing its records has nobody to tell, which is
// no error, so the log shows none ("failed to find any peer in table").
func TestOneNodeShutdownLogsNoWithdrawError(t *testing.T) {
	t.Parallel()
	var logs lockedLog
	srv, err := host.New(host.WithListen("127.0.0.1:*"), host.WithDataDir(t.TempDir()),
		host.WithExperts(host.ExpertConfig{UID: "nop.0", Module: host.ModuleBytes(wasmexperts.Nop), Config: map[string]int64{"hidden_dim": 4}}),
		host.WithUpdatePeriod(500*time.Millisecond), host.WithDHT(host.DHTConfig{}),
		host.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // an announce round or two
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "withdraw") && (strings.Contains(line, "level=INFO") || strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR")) && !strings.Contains(line, "err=<nil>") {
			t.Errorf("a one-node shutdown logs a withdrawal error: %s", line)
		}
	}
}

// lockedLog is a bytes.Buffer that the server's goroutines may log to.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
