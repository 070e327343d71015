package modules_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moehost/moehost/modules"
)

func TestStoreRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := modules.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	wasm := []byte("\x00asm\x01\x00\x00\x00")
	d, err := s.Put(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if d != modules.Digest(wasm) {
		t.Fatalf("digest %s, want %s", d, modules.Digest(wasm))
	}
	if d2, err := s.Put(wasm); err != nil || d2 != d {
		t.Fatalf("second Put: %s, %v", d2, err)
	}
	got, err := s.Get(d)
	if err != nil || string(got) != string(wasm) {
		t.Fatalf("Get: %q, %v", got, err)
	}
	// No temp files are left behind.
	entries, _ := os.ReadDir(filepath.Join(dir, "sha256"))
	if len(entries) != 1 {
		t.Errorf("store holds %d files, want 1", len(entries))
	}
	// A corrupted file is refused, not served.
	h, _ := modules.ParseDigest(d)
	if err := os.WriteFile(filepath.Join(dir, "sha256", h+".wasm"), []byte("evil"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(d); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("Get of a corrupted module: %v", err)
	}
	if _, err := s.Get(modules.Digest([]byte("other"))); !errors.Is(err, modules.ErrNotFound) {
		t.Errorf("Get of a missing module: %v, want ErrNotFound", err)
	}
}

func TestParseDigest(t *testing.T) {
	t.Parallel()
	good := modules.Digest(nil)
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{good, true},
		{strings.ToUpper(good), false},
		{"sha256:abc", false},
		{"md5:" + good[7:], false},
		{"sha256:../../../../etc/passwd" + strings.Repeat("a", 36), false},
		{good[:len(good)-1] + "g", false},
	} {
		if _, err := modules.ParseDigest(tt.in); (err == nil) != tt.ok {
			t.Errorf("ParseDigest(%q): %v", tt.in, err)
		}
	}
}

func FuzzParseDigest(f *testing.F) {
	f.Add(modules.Digest(nil))
	f.Add("sha256:..")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := modules.ParseDigest(s)
		if err == nil && (len(h) != 64 || strings.ContainsAny(h, "./\\")) {
			t.Fatalf("accepted %q as %q", s, h)
		}
	})
}
