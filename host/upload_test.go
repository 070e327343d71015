package host

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	wasmexperts "github.com/moehost/moehost/examples/wasm-experts"
	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/sandbox"
	"github.com/moehost/moehost/modules"
)

// TestUploadIsStagedUntilValidated uploads modules while a goroutine
// watches the store: a refused module never shows in Has or List, during
// the upload or after, and leaves no file in the store; an accepted one
// shows only once the sandbox compiled it, which the compile receipt in
// the server's own (fresh) compilation cache tells.
func TestUploadIsStagedUntilValidated(t *testing.T) {
	noForward, err := os.ReadFile(filepath.Join("internal", "sandbox", "testdata", "bad_no_forward.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		wasm   []byte
		accept bool
	}{
		{"not wasm", []byte("\x00asm\x01\x00\x00\x00 and then garbage"), false},
		{"no moe_forward", noForward, false},
		{"ffn-c", wasmexperts.FFNC, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			cache := t.TempDir()
			srv := startTenantsServer(t, WithCompileCache(cache))
			store, err := srv.experts.LiveStore()
			if err != nil {
				t.Fatal(err)
			}
			api := moduleAPI{srv}
			alice := rpc.Caller{Tenant: "alice"}
			d := modules.Digest(tt.wasm)
			compiled := func() bool {
				entries, _ := os.ReadDir(filepath.Join(cache, "moehost-compiled"))
				return len(entries) > 0
			}

			var seen, early atomic.Bool
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					has := store.Has("alice", d) || slices.ContainsFunc(store.List("alice"), func(m modules.Module) bool { return m.Digest == d })
					if has {
						seen.Store(true)
						if !compiled() {
							early.Store(true)
						}
					}
				}
			})
			mod, err := api.Upload(ctx, alice, rpc.ModuleUpload{Name: tt.name, Size: -1, Body: bytes.NewReader(tt.wasm)})
			close(stop)
			wg.Wait()

			if !tt.accept {
				if !errors.Is(err, sandbox.ErrInvalidModule) {
					t.Fatalf("upload: %v, want ErrInvalidModule", err)
				}
				if seen.Load() {
					t.Error("the store showed the refused module during its upload")
				}
				if store.Has("alice", d) || len(store.List("alice")) != 0 {
					t.Errorf("after the refusal: Has %v, List %v", store.Has("alice", d), store.List("alice"))
				}
				if u := store.Usage("alice"); u != (modules.Usage{}) {
					t.Errorf("Usage after the refusal: %+v, want none", u)
				}
				entries, err := os.ReadDir(filepath.Join(srv.cfg.dataDir, "modules", "sha256"))
				if err != nil {
					t.Fatal(err)
				}
				if len(entries) != 0 {
					t.Errorf("the store's directory holds %d files after the refusal (%s...)", len(entries), entries[0].Name())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if mod.Digest != d {
				t.Fatalf("upload: digest %s, want %s", mod.Digest, d)
			}
			if early.Load() {
				t.Error("the store showed the module before the sandbox compiled it")
			}
			if !store.Has("alice", d) || !compiled() {
				t.Errorf("after the upload: Has %v, compiled %v", store.Has("alice", d), compiled())
			}
		})
	}
}

// TestUploadSameModuleConcurrently has alice and bob upload one module
// at once, each twice: every upload succeeds, each tenant holds one
// reference (an upload of a module it has keeps its first time), and the
// store holds the bytes once and no temp file.
func TestUploadSameModuleConcurrently(t *testing.T) {
	ctx := context.Background()
	srv := startTenantsServer(t)
	store, err := srv.experts.LiveStore()
	if err != nil {
		t.Fatal(err)
	}
	api := moduleAPI{srv}
	d := modules.Digest(wasmexperts.FFNC)
	var wg sync.WaitGroup
	for _, name := range []string{"alice", "bob"} {
		wg.Go(func() {
			c := rpc.Caller{Tenant: name}
			first, err := api.Upload(ctx, c, rpc.ModuleUpload{Size: -1, Body: bytes.NewReader(wasmexperts.FFNC)})
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			again, err := api.Upload(ctx, c, rpc.ModuleUpload{Name: "again", Size: -1, Body: bytes.NewReader(wasmexperts.FFNC)})
			if err != nil || again.Digest != d || !again.Created.Equal(first.Created) || again.Name != first.Name {
				t.Errorf("%s uploading again: %+v, %v, want %+v", name, again, err, first)
			}
		})
	}
	wg.Wait()
	for _, name := range []string{"alice", "bob"} {
		if got := store.List(name); len(got) != 1 || got[0].Digest != d {
			t.Errorf("List(%s): %+v, want %s alone", name, got, d)
		}
	}
	entries, err := os.ReadDir(filepath.Join(srv.cfg.dataDir, "modules", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	h, _ := modules.ParseDigest(d)
	if len(entries) != 1 || entries[0].Name() != h+".wasm" {
		t.Errorf("the store's directory holds %v, want the module alone", entries)
	}
}

// TestCompileInChildIsPerServer starts two servers in one process, one
// whose compile child cannot start: its uploads fail naming the child,
// while the other's, compiling in the process, succeed.
func TestCompileInChildIsPerServer(t *testing.T) {
	ctx := context.Background()
	broken := startTenantsServer(t, WithCompileCache(t.TempDir()),
		WithCompileInChild(filepath.Join(t.TempDir(), "no-such-binary")))
	plain := startTenantsServer(t, WithCompileCache(t.TempDir()))
	alice := rpc.Caller{Tenant: "alice"}
	_, err := moduleAPI{broken}.Upload(ctx, alice, rpc.ModuleUpload{Size: -1, Body: bytes.NewReader(wasmexperts.FFNC)})
	if err == nil || errors.Is(err, sandbox.ErrInvalidModule) || !strings.Contains(err.Error(), "starting a compile child") {
		t.Errorf("upload with a compile child that cannot start: %v, want the host's error naming the child", err)
	}
	if _, err := (moduleAPI{plain}).Upload(ctx, alice, rpc.ModuleUpload{Size: -1, Body: bytes.NewReader(wasmexperts.FFNC)}); err != nil {
		t.Errorf("upload to the server without a compile child: %v", err)
	}
}
