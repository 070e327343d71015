package modules_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/modules"
)

func stage(t *testing.T, s *modules.Store, tenant string, b []byte, q modules.Quota) *modules.Staged {
	t.Helper()
	st, err := s.Stage(tenant, tenant+".wasm", bytes.NewReader(b), 1<<20, q)
	if err != nil {
		t.Fatal(err)
	}
	if st.Digest() != modules.Digest(b) || st.Size() != int64(len(b)) {
		t.Fatalf("Stage: %s %d, want %s %d", st.Digest(), st.Size(), modules.Digest(b), len(b))
	}
	return st
}

// invisible fails the test if anything shows tenant's module d.
func invisible(t *testing.T, s *modules.Store, tenant, d string) {
	t.Helper()
	if s.Has(tenant, d) {
		t.Errorf("Has(%s, %s) of a staged module", tenant, d)
	}
	if got := digests(s.List(tenant)); slices.Contains(got, d) {
		t.Errorf("List(%s) shows a staged module: %v", tenant, got)
	}
	if _, err := s.Get(d); !errors.Is(err, modules.ErrNotFound) {
		t.Errorf("Get of a staged module: %v, want ErrNotFound", err)
	}
	if _, err := s.Pin(tenant, d); !errors.Is(err, modules.ErrNotFound) {
		t.Errorf("Pin of a staged module: %v, want ErrNotFound", err)
	}
	if s.Referenced(d) {
		t.Errorf("Referenced(%s) of a staged module", d)
	}
}

// onlyTemp reports whether the store's module directory holds temp
// files alone.
func onlyTemp(names []string) bool {
	for _, n := range names {
		if !strings.HasPrefix(n, ".tmp-") {
			return false
		}
	}
	return true
}

func TestStagedIsInvisibleUntilCommit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		commit bool
	}{
		{"commit", true},
		{"abort", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s := open(t, dir)
			wasm := []byte("a module the sandbox has not seen")
			st := stage(t, s, "alice", wasm, modules.Quota{})
			d := st.Digest()
			invisible(t, s, "alice", d)
			if got := files(t, dir); len(got) != 1 || !onlyTemp(got) {
				t.Errorf("store holds %v while staged, want one temp file", got)
			}
			if b, err := st.Bytes(); err != nil || !bytes.Equal(b, wasm) {
				t.Errorf("Bytes: %q, %v", b, err)
			}
			if u := s.Usage("alice"); u != (modules.Usage{}) {
				t.Errorf("Usage while staged: %+v, want none", u)
			}
			if !tt.commit {
				if err := st.Abort(); err != nil {
					t.Fatal(err)
				}
				invisible(t, s, "alice", d)
				if got := files(t, dir); len(got) != 0 {
					t.Errorf("store holds %v after Abort, want nothing", got)
				}
				if u := s.Usage("alice"); u != (modules.Usage{}) {
					t.Errorf("Usage after Abort: %+v, want none", u)
				}
				return
			}
			m, err := st.Commit()
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Abort(); err != nil {
				t.Errorf("Abort after Commit: %v", err)
			}
			if m.Digest != d || m.Size != int64(len(wasm)) || m.Name != "alice.wasm" {
				t.Errorf("Commit: %+v", m)
			}
			if !s.Has("alice", d) || !slices.Equal(digests(s.List("alice")), []string{d}) {
				t.Errorf("committed module not seen: List %v", digests(s.List("alice")))
			}
			if b, err := s.Get(d); err != nil || !bytes.Equal(b, wasm) {
				t.Errorf("Get after Commit: %q, %v", b, err)
			}
			if got := files(t, dir); !slices.Equal(got, []string{fileOf(d)}) {
				t.Errorf("store holds %v after Commit, want only the module", got)
			}
			// A restart keeps it.
			if got := digests(open(t, dir).List("alice")); !slices.Equal(got, []string{d}) {
				t.Errorf("after a restart, List: %v", got)
			}
		})
	}
}

// TestStagedHoldsQuota checks that staged uploads count against their
// tenant's caps until they commit or abort, once per module however many
// uploads of it are in flight.
func TestStagedHoldsQuota(t *testing.T) {
	t.Parallel()
	s := open(t, t.TempDir())
	q := modules.Quota{Modules: 1}
	a, b := []byte("module a"), []byte("module b")
	sa := stage(t, s, "t", a, q)
	sa2 := stage(t, s, "t", a, q) // the same module again: no more charge
	if _, err := s.Stage("t", "", bytes.NewReader(b), 1<<20, q); !errors.Is(err, modules.ErrQuota) {
		t.Fatalf("staging a second module past a cap of one: %v, want ErrQuota", err)
	}
	if err := sa.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stage("t", "", bytes.NewReader(b), 1<<20, q); !errors.Is(err, modules.ErrQuota) {
		t.Fatalf("staging b while a is still staged once: %v, want ErrQuota", err)
	}
	if err := sa2.Abort(); err != nil {
		t.Fatal(err)
	}
	sb := stage(t, s, "t", b, q)
	if _, err := sb.Commit(); err != nil {
		t.Fatal(err)
	}
	if u := s.Usage("t"); u != (modules.Usage{Modules: 1, Bytes: int64(len(b))}) {
		t.Errorf("Usage: %+v", u)
	}

	// A byte cap counts staged bytes too, and cuts the stream at what
	// they leave.
	qb := modules.Quota{Bytes: 20}
	s1 := stage(t, s, "u", bytes.Repeat([]byte{1}, 15), qb)
	if _, err := s.Stage("u", "", bytes.NewReader(bytes.Repeat([]byte{2}, 10)), 1<<20, qb); !errors.Is(err, modules.ErrQuota) {
		t.Fatalf("staging past a byte cap that a staged upload fills: %v, want ErrQuota", err)
	}
	if err := s1.Abort(); err != nil {
		t.Fatal(err)
	}
	stage(t, s, "u", bytes.Repeat([]byte{2}, 10), qb).Abort()
}

// TestStagedAgainstDelete commits staged uploads whose module was deleted
// meanwhile: by the only other tenant that had the bytes, and by the
// tenant itself after it staged the module again.
func TestStagedAgainstDelete(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir)
	wasm := []byte("shared module")
	d := upload(t, s, "bob", wasm).Digest

	st := stage(t, s, "alice", wasm, modules.Quota{})
	if st.Had() {
		t.Error("Had: alice never had the module")
	}
	if err := s.Delete("bob", d); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(d); !errors.Is(err, modules.ErrNotFound) {
		t.Fatalf("Get after the last reference went: %v", err)
	}
	if _, err := st.Commit(); err != nil {
		t.Fatal(err)
	}
	if b, err := s.Get(d); err != nil || !bytes.Equal(b, wasm) {
		t.Errorf("Get after alice's commit: %q, %v", b, err)
	}

	// alice uploads it again, deletes it while that upload is staged:
	// the commit brings it back, within her caps.
	again := stage(t, s, "alice", wasm, modules.Quota{Modules: 1})
	if !again.Had() {
		t.Error("Had: alice has the module")
	}
	if err := s.Delete("alice", d); err != nil {
		t.Fatal(err)
	}
	if _, err := again.Commit(); err != nil {
		t.Fatal(err)
	}
	if !s.Has("alice", d) || s.Has("bob", d) {
		t.Errorf("Has: alice %v bob %v, want alice only", s.Has("alice", d), s.Has("bob", d))
	}
	if got := files(t, dir); !slices.Equal(got, []string{fileOf(d)}) {
		t.Errorf("store holds %v, want only the module", got)
	}
}
