//go:build unix

package tenant_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moehost/moehost/host/tenant"
)

// TestWatchSIGHUP sends the process a real SIGHUP.
func TestWatchSIGHUP(t *testing.T) {
	path, alice, _ := newFile(t)
	s, err := tenant.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	stop := s.WatchSIGHUP(context.Background(), log)
	defer stop()

	f, err := tenant.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Remove("alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := s.Authenticate(alice); return !ok })

	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "keeping the previous tenants")
	})
	if _, ok := s.Tenant("bob"); !ok {
		t.Error("a bad file on SIGHUP dropped bob")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// waitFor polls cond for up to 10 s: signals arrive asynchronously.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 10s")
}
