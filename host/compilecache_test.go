package host_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/moehost/moehost/host"
)

// TestCompileCache checks where a server keeps compiled modules: in the
// directory WithCompileCache names, else in $MOEHOST_COMPILE_CACHE, else
// in its data dir; and never in the data dir when one of the first two is
// set, so that servers sharing a cache compile a module once.
func TestCompileCache(t *testing.T) {
	start := func(t *testing.T, dataDir string, opts ...host.Option) {
		t.Helper()
		ctx := context.Background()
		srv, err := host.New(append([]host.Option{host.WithListen("127.0.0.1:*"), host.WithDataDir(dataDir),
			host.WithExperts(host.ExpertConfig{UID: "trap.0", Module: host.ModuleBytes(host.TrapWasm())})}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	entries := func(dir string) int {
		ents, _ := os.ReadDir(dir)
		return len(ents)
	}
	for _, tt := range []struct {
		name   string
		option bool // WithCompileCache(shared), else $MOEHOST_COMPILE_CACHE
		env    bool // $MOEHOST_COMPILE_CACHE set
	}{
		{"option", true, false},
		{"option over the environment", true, true},
		{"environment", false, true},
		{"data dir", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			shared, other := t.TempDir(), t.TempDir()
			var opts []host.Option
			if tt.option {
				opts = append(opts, host.WithCompileCache(shared))
			}
			switch {
			case tt.env && tt.option:
				t.Setenv(host.CompileCacheEnv, other)
			case tt.env:
				t.Setenv(host.CompileCacheEnv, shared)
			default:
				t.Setenv(host.CompileCacheEnv, "")
			}
			data := t.TempDir()
			start(t, data, opts...)
			inData := entries(filepath.Join(data, "cache", "wazero"))
			if tt.option || tt.env {
				if entries(shared) == 0 || inData != 0 || entries(other) != 0 {
					t.Errorf("%d entries in the shared cache, %d in the data dir, %d in the other: want the shared cache only", entries(shared), inData, entries(other))
				}
				return
			}
			if inData == 0 {
				t.Error("no compiled module in the data dir's cache")
			}
		})
	}
}
