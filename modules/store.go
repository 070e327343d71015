package modules

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moehost/moehost/internal/atomicfile"
)

// Operator is the tenant name of the host's operator: Put records its
// references under it.
const Operator = ""

// Module is one tenant's reference to a stored module.
type Module struct {
	Digest   string    // "sha256:<hex>"
	Name     string    // as uploaded; informational
	Size     int64     // bytes
	Uploaded time.Time // first upload by this tenant
}

// Usage is what a tenant keeps in the store. Bytes counts each module's
// full size, even when another tenant shares its bytes: a tenant's usage
// never depends on what others upload or delete.
type Usage struct {
	Modules int
	Bytes   int64
}

// Quota caps what one tenant may keep in the store. A zero field means no
// cap.
type Quota struct {
	Modules int   // modules referenced
	Bytes   int64 // sum of their sizes
}

type refKey struct{ tenant, digest string }

// Store keeps modules under a directory. Its methods are safe for
// concurrent use by one process; two processes must not share a
// directory.
type Store struct {
	dir string

	mu      sync.Mutex
	refs    map[string]map[string]Module // tenant → digest → module
	pins    map[refKey]int
	pending map[refKey]*reservation // staged uploads' hold on their tenants' caps

	afterBytes func() error // test hook: a non-nil error simulates a crash there
}

// Open opens (creating it if needed) the store in dir. It reads the index,
// drops references whose bytes are gone, and removes bytes that nothing
// references and temp files that a crash left. A store written before the
// index existed has its modules adopted by the Operator.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, "sha256"), 0o755); err != nil {
		return nil, fmt.Errorf("opening module store: %w", err)
	}
	s := &Store{dir: dir, refs: map[string]map[string]Module{}, pins: map[refKey]int{}, pending: map[refKey]*reservation{}}
	b, err := os.ReadFile(s.indexPath())
	switch {
	case errors.Is(err, fs.ErrNotExist):
		b = nil
	case err != nil:
		return nil, fmt.Errorf("opening module store: reading index: %w", err)
	}
	if b != nil {
		mods, err := decodeIndex(b)
		if err != nil {
			return nil, fmt.Errorf("opening module store: index %s: %w", indexFile, err)
		}
		for _, m := range mods {
			s.addRef(m.tenant, m.Module)
		}
	}
	if err := s.sweep(b == nil); err != nil {
		return nil, fmt.Errorf("opening module store: %w", err)
	}
	return s, nil
}

const indexFile = "index.json"

func (s *Store) indexPath() string { return filepath.Join(s.dir, indexFile) }

func (s *Store) path(hexDigest string) string {
	return filepath.Join(s.dir, "sha256", hexDigest+".wasm")
}

func (s *Store) addRef(tenant string, m Module) {
	if s.refs[tenant] == nil {
		s.refs[tenant] = map[string]Module{}
	}
	s.refs[tenant][m.Digest] = m
}

// Referenced reports whether any tenant (or the operator) has module d.
func (s *Store) Referenced(d string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.referenced(d)
}

func (s *Store) referenced(d string) bool {
	for _, mods := range s.refs {
		if _, ok := mods[d]; ok {
			return true
		}
	}
	return false
}

// sweep reconciles the bytes on disk with the index; adopt gives
// unreferenced modules to the Operator instead of removing them.
func (s *Store) sweep(adopt bool) error {
	dir := filepath.Join(s.dir, "sha256")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	present := map[string]int64{}
	changed := false
	for _, e := range entries {
		name := e.Name()
		h, isWasm := strings.CutSuffix(name, ".wasm")
		d := DigestPrefix + h
		if _, err := ParseDigest(d); !isWasm || err != nil || !e.Type().IsRegular() {
			if strings.HasPrefix(name, ".tmp-") {
				if err := os.Remove(filepath.Join(dir, name)); err != nil {
					return fmt.Errorf("removing temp file: %w", err)
				}
				changed = true
			}
			continue
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case s.referenced(d):
			present[d] = info.Size()
		case adopt:
			present[d] = info.Size()
			s.addRef(Operator, Module{Digest: d, Size: info.Size(), Uploaded: info.ModTime().UTC()})
			changed = true
		default:
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return fmt.Errorf("removing unreferenced module %s: %w", d, err)
			}
			changed = true
		}
	}
	for tenant, mods := range s.refs {
		for d := range mods {
			if _, ok := present[d]; !ok {
				delete(mods, d)
				changed = true
			}
		}
		if len(mods) == 0 {
			delete(s.refs, tenant)
		}
	}
	if !changed {
		return nil
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	return s.writeIndex()
}

// writeIndex persists the references; the caller holds s.mu (or owns s).
func (s *Store) writeIndex() error {
	var all []tenantModule
	for tenant, mods := range s.refs {
		for _, m := range mods {
			all = append(all, tenantModule{tenant, m})
		}
	}
	slices.SortFunc(all, func(a, b tenantModule) int {
		return cmp.Or(strings.Compare(a.tenant, b.tenant), strings.Compare(a.Digest, b.Digest))
	})
	b, err := encodeIndex(all)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.indexPath(), b); err != nil {
		return fmt.Errorf("writing module index: %w", err)
	}
	return nil
}

// Put stores wasm for the Operator and returns its digest. Storing a
// module twice is cheap.
func (s *Store) Put(wasm []byte) (string, error) {
	d := Digest(wasm)
	s.mu.Lock()
	_, ok := s.refs[Operator][d]
	s.mu.Unlock()
	if ok {
		return d, nil
	}
	m, err := s.Upload(Operator, "", bytes.NewReader(wasm), int64(len(wasm)), Quota{})
	if err != nil {
		return "", err
	}
	return m.Digest, nil
}

// Upload stages a module from r for tenant and commits it at once (see
// Stage and Staged.Commit), for modules that need no validation or were
// validated before: the host keeps its own configured modules so.
func (s *Store) Upload(tenant, name string, r io.Reader, maxBytes int64, q Quota) (Module, error) {
	st, err := s.Stage(tenant, name, r, maxBytes, q)
	if err != nil {
		return Module{}, err
	}
	return st.Commit()
}

func (s *Store) dropRef(tenant, d string) {
	delete(s.refs[tenant], d)
	if len(s.refs[tenant]) == 0 {
		delete(s.refs, tenant)
	}
}

func (s *Store) usage(tenant string) Usage {
	var u Usage
	for _, m := range s.refs[tenant] {
		u.Modules++
		u.Bytes += m.Size
	}
	return u
}

// Usage returns what tenant keeps in the store, for checking caps before
// an upload starts.
func (s *Store) Usage(tenant string) Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usage(tenant)
}

// List returns tenant's modules, oldest upload first.
func (s *Store) List(tenant string) []Module {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Module, 0, len(s.refs[tenant]))
	for _, m := range s.refs[tenant] {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Module) int {
		return cmp.Or(a.Uploaded.Compare(b.Uploaded), strings.Compare(a.Digest, b.Digest))
	})
	return out
}

// Has reports whether tenant has the module with digest d. Check it before
// Get on a tenant's behalf: Get itself serves any stored module.
func (s *Store) Has(tenant, d string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.refs[tenant][d]
	return ok
}

// Pin marks tenant's module d as in use (deployed), so that Delete refuses
// it with ErrInUse until every pin is released. The returned func releases
// this pin; calling it again does nothing. Pins live in memory only: after
// a restart the host pins again what it redeploys, and until then Open
// removes nothing that the index references. Pin fails with ErrNotFound if
// tenant does not have d.
func (s *Store) Pin(tenant, d string) (unpin func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.refs[tenant][d]; !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, d)
	}
	k := refKey{tenant, d}
	s.pins[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.pins[k]--; s.pins[k] <= 0 {
				delete(s.pins, k)
			}
		})
	}, nil
}

// Delete removes tenant's reference to module d: ErrNotFound if it has
// none, ErrInUse if the reference is pinned. The bytes are removed when no
// tenant references them any more.
func (s *Store) Delete(tenant, d string) error {
	hexd, err := ParseDigest(d)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.refs[tenant][d]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, d)
	}
	if n := s.pins[refKey{tenant, d}]; n > 0 {
		return fmt.Errorf("%w: %s is deployed (%d pins)", ErrInUse, d, n)
	}
	s.dropRef(tenant, d)
	if err := s.writeIndex(); err != nil {
		s.addRef(tenant, m)
		return err
	}
	if s.referenced(d) {
		return nil
	}
	if err := os.Remove(s.path(hexd)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		// The index no longer refers to the bytes; Open removes them.
		return fmt.Errorf("removing module %s: %w", d, err)
	}
	return syncDir(filepath.Dir(s.path(hexd)))
}

// Get returns the module with digest d, checking that its bytes still
// match it. It serves any stored module: check Has first on a tenant's
// behalf.
func (s *Store) Get(d string) ([]byte, error) {
	h, err := ParseDigest(d)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.path(h))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, d)
	}
	if err != nil {
		return nil, fmt.Errorf("reading module %s: %w", d, err)
	}
	if Digest(b) != d {
		return nil, fmt.Errorf("module %s is corrupt on disk: its bytes hash to %s", d, Digest(b))
	}
	return b, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
