package tenant_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/moehost/moehost/host/tenant"
)

// newFile writes a tenants file with alice (prefix alice) and bob
// (prefixes bob, ffn) and returns its path and their tokens.
func newFile(t *testing.T) (path, alice, bob string) {
	t.Helper()
	var f tenant.File
	var err error
	if alice, err = f.Add("alice", []string{"alice"}, tenant.Caps{}); err != nil {
		t.Fatal(err)
	}
	if bob, err = f.Add("bob", []string{"bob", "ffn"}, tenant.Caps{QueueShare: 2}); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "tenants.json")
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	return path, alice, bob
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	path, alice, bob := newFile(t)
	s, err := tenant.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	flip := []byte(alice)
	flip[len(flip)-1] ^= 1
	tests := []struct {
		name, token, want string
	}{
		{"alice", alice, "alice"},
		{"bob", bob, "bob"},
		{"empty", "", ""},
		{"last character changed", string(flip), ""},
		{"without prefix", alice[len(tenant.TokenPrefix):], ""},
		{"with a space", alice + " ", ""},
		{"bearer prefix kept", "Bearer " + alice, ""},
		{"hash of a token", "sha256:" + alice, ""},
		{"long", strings.Repeat("moe_", 1000), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, ok := s.Authenticate(tt.token)
			if name != tt.want || ok != (tt.want != "") {
				t.Errorf("Authenticate = %q, %v; want %q", name, ok, tt.want)
			}
		})
	}
}

// TestReload: a removed token stops working at once, a new one starts,
// and a bad file keeps the old set.
func TestReload(t *testing.T) {
	t.Parallel()
	path, alice, bob := newFile(t)
	var reloads atomic.Int32
	s, err := tenant.Open(path, tenant.WithReloadHook(func() { reloads.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	f, err := tenant.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Remove("alice"); err != nil {
		t.Fatal(err)
	}
	carol, err := f.Add("carol", []string{"carol"}, tenant.Caps{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Authenticate(alice); !ok {
		t.Fatal("alice's token stopped working before Reload")
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if reloads.Load() != 1 {
		t.Errorf("reload hook ran %d times, want 1", reloads.Load())
	}
	if name, ok := s.Authenticate(alice); ok {
		t.Errorf("removed alice's token still authenticates as %q", name)
	}
	if _, ok := s.Tenant("alice"); ok {
		t.Error("removed alice is still a tenant")
	}
	if name, _ := s.Authenticate(carol); name != "carol" {
		t.Errorf("carol's token authenticates as %q", name)
	}
	if name, _ := s.Authenticate(bob); name != "bob" {
		t.Errorf("bob's token authenticates as %q", name)
	}

	for _, bad := range []struct{ name, content string }{
		{"not json", "{"},
		{"overlap", strings.Replace(string(f.Marshal()), `"carol"`+"\n", `"bob.x"`+"\n", 1)},
	} {
		if err := os.WriteFile(path, []byte(bad.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.Reload(); err == nil {
			t.Errorf("%s: Reload succeeded", bad.name)
		}
		if name, _ := s.Authenticate(carol); name != "carol" {
			t.Errorf("%s: after a failed Reload carol's token authenticates as %q", bad.name, name)
		}
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil {
		t.Error("Reload of a removed file succeeded")
	}
	if name, _ := s.Authenticate(bob); name != "bob" {
		t.Errorf("after a failed Reload bob's token authenticates as %q", name)
	}
	if reloads.Load() != 1 {
		t.Errorf("reload hook ran %d times, want 1 (failed reloads do not call it)", reloads.Load())
	}
}

// TestReloadHammer authenticates from many goroutines while the file is
// rewritten and reloaded: every answer comes from a whole file.
func TestReloadHammer(t *testing.T) {
	t.Parallel()
	path, alice, bob := newFile(t)
	s, err := tenant.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := tenant.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	without := *f
	if err := without.Remove("alice"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if name, ok := s.Authenticate(bob); !ok || name != "bob" {
					t.Errorf("bob's token authenticated as %q, %v", name, ok)
					return
				}
				if name, ok := s.Authenticate(alice); ok && name != "alice" {
					t.Errorf("alice's token authenticated as %q", name)
					return
				}
			}
		})
	}
	for i := range 50 {
		g := f
		if i%2 == 0 {
			g = &without
		}
		if err := g.Save(path); err != nil {
			t.Fatal(err)
		}
		if err := s.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	wg.Wait()
}

func TestMayDeploy(t *testing.T) {
	t.Parallel()
	path, _, _ := newFile(t)
	s, err := tenant.Open(path, tenant.WithOperatorUIDs("ffn.0", "ffn.1", "ffn.2", "ffn.3"), tenant.WithOperatorPrefixes("bob.reserved", "bob.9"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tenant, uid string
		want        error
	}{
		{"alice", "alice.0", nil},
		{"alice", "alice.[0:64]", nil},
		{"alice", "alicex.0", tenant.ErrNotOwner},
		{"alice", "bob.0", tenant.ErrNotOwner},
		{"alice", "alice.[0:4", tenant.ErrInvalidPattern},
		{"carol", "carol.0", tenant.ErrUnknownTenant},
		{"bob", "bob.1", nil},
		{"bob", "ffn.4", nil},
		{"bob", "ffn.0", tenant.ErrOperatorOwned},
		{"bob", "ffn.[3:8]", tenant.ErrOperatorOwned},
		{"bob", "ffn.[4:8]", nil},
		{"bob", "ffn.[0:4].x", nil}, // ffn.0.x is not ffn.0
		{"bob", "ffn.0.x", nil},
		{"bob", "bob.reserved", tenant.ErrOperatorOwned},
		{"bob", "bob.reserved.7", tenant.ErrOperatorOwned},
		{"bob", "bob.[10:1000].x", nil},
		{"bob", "bob.[0:16]", tenant.ErrOperatorOwned},
		{"bob", "bob.[0:16].y", tenant.ErrOperatorOwned},
		{"bob", "bob.[0:9]", nil},
		{"bob", "bob.reservedx", nil},
	}
	for _, tt := range tests {
		t.Run(tt.tenant+"/"+tt.uid, func(t *testing.T) {
			t.Parallel()
			err := s.MayDeploy(tt.tenant, tt.uid)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("MayDeploy(%q, %q) = %v, want %v", tt.tenant, tt.uid, err, tt.want)
			}
		})
	}
	if s.Owns("bob", "ffn.0") != true {
		t.Error("Owns(bob, ffn.0) is false: ownership is by prefix; the operator check is MayDeploy's")
	}
	if _, err := tenant.Open(path, tenant.WithOperatorPrefixes("bad..prefix")); err == nil {
		t.Error("Open accepted a malformed operator prefix")
	}
	if c, ok := s.Caps("bob", tenant.Caps{Experts: 7}); !ok || c.QueueShare != 2 || c.Experts != 7 || c.Modules != tenant.DefaultCaps.Modules {
		t.Errorf("Caps(bob) = %+v, %v", c, ok)
	}
}

func TestOpenMissing(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "none.json")
	_, err := tenant.Open(path)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "moehost tenant add") {
		t.Errorf("Open of a missing file: %v; want fs.ErrNotExist and how to create it", err)
	}
}

// BenchmarkAuthenticate measures a sign-in against many stored tokens:
// one SHA-256 and a constant-time compare per stored hash.
func BenchmarkAuthenticate(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			var f tenant.File
			var last string
			for i := range n {
				tok, err := f.Add(fmt.Sprintf("t%d", i), []string{fmt.Sprintf("p%d", i)}, tenant.Caps{})
				if err != nil {
					b.Fatal(err)
				}
				last = tok
			}
			path := filepath.Join(b.TempDir(), tenant.FileName)
			if err := f.Save(path); err != nil {
				b.Fatal(err)
			}
			s, err := tenant.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, ok := s.Authenticate(last); !ok {
					b.Fatal("token refused")
				}
			}
		})
	}
}
