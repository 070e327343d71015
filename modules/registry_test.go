package modules_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moehost/moehost/modules"
)

func open(t *testing.T, dir string) *modules.Store {
	t.Helper()
	s, err := modules.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// files lists the store's module directory.
func files(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func fileOf(d string) string {
	h, _ := modules.ParseDigest(d)
	return h + ".wasm"
}

func upload(t *testing.T, s *modules.Store, tenant string, b []byte) modules.Module {
	t.Helper()
	m, err := s.Upload(tenant, tenant+".wasm", bytes.NewReader(b), 1<<20, modules.Quota{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Digest != modules.Digest(b) || m.Size != int64(len(b)) {
		t.Fatalf("Upload: %+v, want digest %s size %d", m, modules.Digest(b), len(b))
	}
	return m
}

func digests(ms []modules.Module) []string {
	var ds []string
	for _, m := range ms {
		ds = append(ds, m.Digest)
	}
	return ds
}

// zeros is an endless reader that is not a byte slice in disguise.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	clear(p)
	z.n += int64(len(p))
	return len(p), nil
}

func TestUploadStreamsAndCaps(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)

	// 16 MiB goes through without being held in memory.
	const size = 16 << 20
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	m, err := s.Upload("alice", "big", io.LimitReader(&zeros{}, size), size, modules.Quota{})
	goruntime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 2<<20 {
		t.Errorf("a %d-byte upload allocated %d bytes", size, alloc)
	}
	if want := modules.Digest(make([]byte, size)); m.Digest != want || m.Size != size {
		t.Errorf("Upload: %s %d, want %s %d", m.Digest, m.Size, want, size)
	}

	// One byte past the cap is refused, the error names the cap, the
	// reader is not drained, and nothing stays on disk.
	z := &zeros{}
	_, err = s.Upload("alice", "bomb", z, 1<<20, modules.Quota{})
	if !errors.Is(err, modules.ErrTooLarge) || !strings.Contains(err.Error(), "1048576 bytes") {
		t.Errorf("upload past the cap: %v, want ErrTooLarge naming 1048576 bytes", err)
	}
	if z.n > 2<<20 {
		t.Errorf("read %d bytes of an endless upload with a 1 MiB cap", z.n)
	}
	// A tenant's byte quota below the upload cap cuts the stream there.
	z = &zeros{}
	_, err = s.Upload("carol", "bomb", z, 1<<20, modules.Quota{Bytes: 4096})
	if !errors.Is(err, modules.ErrQuota) || !strings.Contains(err.Error(), "4096 bytes") {
		t.Errorf("upload past the quota: %v, want ErrQuota naming 4096 bytes", err)
	}
	if z.n > 4097 {
		t.Errorf("read %d bytes of an endless upload with 4096 bytes of quota left", z.n)
	}
	if got := files(t, dir); !slices.Equal(got, []string{fileOf(m.Digest)}) {
		t.Errorf("store holds %v, want only the first module", got)
	}
	if got := digests(s.List("alice")); !slices.Equal(got, []string{m.Digest}) {
		t.Errorf("List: %v", got)
	}
}

func TestTenantsShareBytesNotVisibility(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	wasm := []byte("\x00asm\x01\x00\x00\x00shared")
	d := modules.Digest(wasm)

	a := upload(t, s, "alice", wasm)
	if s.Has("bob", d) || len(s.List("bob")) != 0 {
		t.Fatal("bob sees alice's module")
	}
	if err := s.Delete("bob", d); !errors.Is(err, modules.ErrNotFound) {
		t.Errorf("bob deleting alice's module: %v, want ErrNotFound", err)
	}
	if _, err := s.Pin("bob", d); !errors.Is(err, modules.ErrNotFound) {
		t.Errorf("bob pinning alice's module: %v, want ErrNotFound", err)
	}
	b := upload(t, s, "bob", wasm)
	if a.Name != "alice.wasm" || b.Name != "bob.wasm" {
		t.Errorf("names %q and %q: each tenant keeps its own", a.Name, b.Name)
	}
	if got := files(t, dir); len(got) != 1 {
		t.Errorf("two tenants' copies take %d files, want 1", len(got))
	}
	for _, tenant := range []string{"alice", "bob"} {
		if u := s.Usage(tenant); u != (modules.Usage{Modules: 1, Bytes: int64(len(wasm))}) {
			t.Errorf("Usage(%s) = %+v", tenant, u)
		}
	}
	if u := s.Usage("carol"); u != (modules.Usage{}) {
		t.Errorf("Usage(carol) = %+v", u)
	}

	if err := s.Delete("alice", d); err != nil {
		t.Fatal(err)
	}
	if s.Has("alice", d) || !s.Has("bob", d) {
		t.Error("alice's delete took bob's reference, or left hers")
	}
	if got, err := s.Get(d); err != nil || !bytes.Equal(got, wasm) {
		t.Errorf("bob's module after alice's delete: %v", err)
	}
	if err := s.Delete("bob", d); err != nil {
		t.Fatal(err)
	}
	if got := files(t, dir); len(got) != 0 {
		t.Errorf("store holds %v after the last reference went", got)
	}
	if _, err := s.Get(d); !errors.Is(err, modules.ErrNotFound) {
		t.Errorf("Get after delete: %v", err)
	}
}

func TestUploadIdempotentAndQuota(t *testing.T) {
	t.Parallel()
	mod := func(i int) []byte { return []byte(fmt.Sprintf("module %d of ten bytes", i)) }
	for _, tt := range []struct {
		name  string
		quota modules.Quota
		fits  int // modules that fit
		msg   string
	}{
		{"modules cap", modules.Quota{Modules: 2}, 2, "keeps 2 modules"},
		{"bytes cap", modules.Quota{Bytes: 50}, 2, "over the cap of 50"},
		{"both", modules.Quota{Modules: 3, Bytes: 1000}, 3, "keeps 3 modules"},
		{"no cap", modules.Quota{}, 5, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s := open(t, dir)
			var first []modules.Module
			for i := range 5 {
				m, err := s.Upload("t", "", bytes.NewReader(mod(i)), 1<<20, tt.quota)
				if i < tt.fits {
					if err != nil {
						t.Fatalf("module %d: %v", i, err)
					}
					first = append(first, m)
					continue
				}
				if !errors.Is(err, modules.ErrQuota) || !strings.Contains(err.Error(), tt.msg) {
					t.Errorf("module %d: %v, want ErrQuota with %q", i, err, tt.msg)
				}
			}
			if got := files(t, dir); len(got) != tt.fits {
				t.Errorf("store holds %d files, want %d", len(got), tt.fits)
			}
			// Uploading again, at the cap, changes nothing.
			for i, want := range first {
				m, err := s.Upload("t", "renamed", bytes.NewReader(mod(i)), 1<<20, tt.quota)
				if err != nil || m != want {
					t.Errorf("second upload of module %d: %+v, %v, want %+v", i, m, err, want)
				}
			}
			if u := s.Usage("t"); u.Modules != tt.fits {
				t.Errorf("Usage: %+v, want %d modules", u, tt.fits)
			}
		})
	}
}

func TestPinRefusesDelete(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())
	wasm := []byte("pinned module")
	d := upload(t, s, "alice", wasm).Digest
	upload(t, s, "bob", wasm)
	unpin1, err := s.Pin("alice", d)
	if err != nil {
		t.Fatal(err)
	}
	unpin2, err := s.Pin("alice", d)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("alice", d); !errors.Is(err, modules.ErrInUse) {
		t.Errorf("delete of a pinned module: %v, want ErrInUse", err)
	}
	// Alice's pin does not hold bob's reference.
	if err := s.Delete("bob", d); err != nil {
		t.Errorf("bob's delete: %v", err)
	}
	unpin1()
	unpin1() // a second call does nothing: the other pin still holds
	if err := s.Delete("alice", d); !errors.Is(err, modules.ErrInUse) {
		t.Errorf("delete with one pin left: %v, want ErrInUse", err)
	}
	unpin2()
	if err := s.Delete("alice", d); err != nil {
		t.Errorf("delete after unpinning: %v", err)
	}
	if _, err := s.Get(d); !errors.Is(err, modules.ErrNotFound) {
		t.Errorf("Get after the last delete: %v", err)
	}
}

func TestRestartKeepsReferences(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	shared := []byte("shared")
	upload(t, s, "alice", shared)
	upload(t, s, "alice", []byte("alice only"))
	upload(t, s, "bob", shared)
	upload(t, s, "bob", []byte("bob only"))
	if err := s.Delete("bob", modules.Digest([]byte("bob only"))); err != nil {
		t.Fatal(err)
	}
	opd, err := s.Put([]byte("operator's"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]modules.Module{"alice": s.List("alice"), "bob": s.List("bob"), modules.Operator: s.List(modules.Operator)}

	s2 := open(t, dir)
	for tenant, w := range want {
		if got := s2.List(tenant); !slices.EqualFunc(got, w, func(a, b modules.Module) bool {
			return a.Digest == b.Digest && a.Name == b.Name && a.Size == b.Size && a.Uploaded.Equal(b.Uploaded)
		}) {
			t.Errorf("after reopening, List(%q) = %+v, want %+v", tenant, got, w)
		}
	}
	if got := digests(s2.List(modules.Operator)); !slices.Equal(got, []string{opd}) {
		t.Errorf("operator's modules: %v", got)
	}
	if got := files(t, dir); len(got) != 3 {
		t.Errorf("store holds %v, want 3 modules", got)
	}
}

// TestCrashBetweenBytesAndIndex stops uploads where a crash could, after
// the bytes are in place and before the index refers to them, and leaves
// a temp file of an upload cut short: opening the store again removes
// what nothing references and keeps the rest.
func TestCrashBetweenBytesAndIndex(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	kept := upload(t, s, "alice", []byte("kept"))
	crash := errors.New("crash")
	modules.CrashAfterBytes(s, crash)
	if _, err := s.Upload("bob", "", strings.NewReader("lost"), 100, modules.Quota{}); !errors.Is(err, crash) {
		t.Fatalf("upload: %v", err)
	}
	// Bob's copy of alice's module: the bytes are alice's, and stay.
	if _, err := s.Upload("bob", "", strings.NewReader("kept"), 100, modules.Quota{}); !errors.Is(err, crash) {
		t.Fatalf("upload: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sha256", ".tmp-123"), []byte("half"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := files(t, dir); len(got) != 3 {
		t.Fatalf("before reopening the store holds %v, want 2 modules and a temp file", got)
	}

	s2 := open(t, dir)
	if got := files(t, dir); !slices.Equal(got, []string{fileOf(kept.Digest)}) {
		t.Errorf("after reopening the store holds %v, want only %s", got, fileOf(kept.Digest))
	}
	if len(s2.List("bob")) != 0 || !s2.Has("alice", kept.Digest) {
		t.Errorf("after reopening: bob %v, alice %v", s2.List("bob"), s2.List("alice"))
	}
	if _, err := s2.Get(kept.Digest); err != nil {
		t.Error(err)
	}
}

// TestAdoptsStoreWithoutIndex opens a store written before the index
// existed: its modules become the operator's, none are removed.
func TestAdoptsStoreWithoutIndex(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	d := upload(t, s, "x", []byte("old module")).Digest
	if err := os.Remove(filepath.Join(dir, "index.json")); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, dir)
	if got := digests(s2.List(modules.Operator)); !slices.Equal(got, []string{d}) {
		t.Errorf("operator's modules %v, want %s", got, d)
	}
	if open(t, dir).Has(modules.Operator, d) != true {
		t.Error("adoption did not survive a second reopening")
	}
}

func TestCorruptIndexIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open(t, dir)
	if err := os.WriteFile(filepath.Join(dir, "index.json"), []byte(`{"version":1,"modules":[{"digest":"sha256:zz"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := modules.Open(dir); err == nil || !strings.Contains(err.Error(), "index.json") {
		t.Errorf("Open with a corrupt index: %v, want an error naming index.json", err)
	}
}

// TestRegistryHammer uploads and deletes the same modules from many
// tenants at once (run with -race); afterwards the bytes on disk are
// exactly those some tenant references.
func TestRegistryHammer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := fmt.Sprint("t", g)
			for i := range 40 {
				b := []byte(fmt.Sprint("module ", i%4))
				m, err := s.Upload(tenant, "", bytes.NewReader(b), 100, modules.Quota{})
				if err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if err := s.Delete(tenant, m.Digest); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	want := map[string]bool{}
	for g := range 6 {
		for _, m := range s.List(fmt.Sprint("t", g)) {
			want[fileOf(m.Digest)] = true
			if _, err := s.Get(m.Digest); err != nil {
				t.Error(err)
			}
		}
	}
	got := files(t, dir)
	if len(got) != len(want) {
		t.Errorf("store holds %v, want %v", got, want)
	}
	for _, f := range got {
		if !want[f] {
			t.Errorf("unreferenced %s left", f)
		}
	}
}

func FuzzDecodeIndex(f *testing.F) {
	f.Add([]byte(`{"version":1,"modules":[]}`))
	f.Add([]byte(`{"version":1,"modules":[{"tenant":"a","digest":"` + modules.Digest(nil) + `","name":"x","size":3,"uploaded":"2026-01-01T00:00:00Z"}]}`))
	f.Add([]byte(`{"version":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := modules.DecodeIndex(b); err != nil {
			return
		}
		if ok, err := modules.RoundTripIndex(b); !ok || err != nil {
			t.Fatalf("accepted index does not survive a round trip: %v", err)
		}
	})
}
