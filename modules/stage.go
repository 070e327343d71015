package modules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Staged is an upload written in full to a temp file in the store and
// hashed, that nobody sees yet: Has, Get, List and Pin ignore it until
// Commit records the tenant's reference, and Abort leaves nothing of it.
// Between the two the host validates its bytes (Bytes), so that a module
// that the sandbox refuses is never visible, even for a moment. While
// staged, a module counts against its tenant's caps, once however many
// uploads of it are in flight, so that two uploads that only one fits
// cannot both be validated. A Staged is for one goroutine.
type Staged struct {
	s      *Store
	tenant string
	name   string
	tmp    string // "" once committed or aborted
	digest string
	size   int64
	q      Quota
	had    bool // the tenant had the module when staging ended
}

// reservation is what a tenant's staged uploads of one module hold
// against its caps.
type reservation struct {
	stages int
	size   int64
}

// Stage streams a module from r into a temp file in the store for
// tenant, hashing it on the way and never holding it in memory. It reads
// at most maxBytes (the per-upload cap, which bounds the disk an upload
// in flight can take): past it, it fails with ErrTooLarge and keeps
// nothing. Staging a module the tenant already has succeeds even at the
// tenant's caps (Had); otherwise keeping it must fit q, with what the
// tenant's other staged uploads hold, or Stage fails with ErrQuota. The
// caller must Commit or Abort the result.
func (s *Store) Stage(tenant, name string, r io.Reader, maxBytes int64, q Quota) (_ *Staged, err error) {
	dir := filepath.Join(s.dir, "sha256")
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("staging module: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// The byte quota also cuts the stream short, so that an upload that
	// cannot fit does not fill the disk up to the upload cap first. A
	// module the tenant already has may be uploaded again at the cap, so
	// the stream may run to the largest of those.
	limit, quota := maxBytes, false
	if q.Bytes > 0 {
		s.mu.Lock()
		room := q.Bytes - s.usage(tenant).Bytes - s.pendingUsage(tenant, "").Bytes
		for _, m := range s.refs[tenant] {
			room = max(room, m.Size)
		}
		s.mu.Unlock()
		if room < limit {
			limit, quota = max(room, 0), true
		}
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("staging module: %w", err)
	}
	if n > limit && quota {
		return nil, fmt.Errorf("%w: the upload passed the %d bytes that the tenant's cap of %d leaves", ErrQuota, limit, q.Bytes)
	}
	if n > limit {
		return nil, fmt.Errorf("%w: module is larger than the upload cap of %d bytes", ErrTooLarge, maxBytes)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("staging module: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("staging module: %w", err)
	}
	d := DigestPrefix + hex.EncodeToString(h.Sum(nil))
	st := &Staged{s: s, tenant: tenant, name: name, tmp: tmp, digest: d, size: n, q: q}

	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.refs[tenant][d]; ok {
		st.had = true
		return st, nil
	}
	k := refKey{tenant, d}
	if res, ok := s.pending[k]; ok {
		res.stages++
		return st, nil
	}
	if err := s.admit(tenant, d, n, q); err != nil {
		return nil, err
	}
	s.pending[k] = &reservation{stages: 1, size: n}
	return st, nil
}

// pendingUsage is what tenant's staged uploads hold, but for those of
// module except; the caller holds s.mu.
func (s *Store) pendingUsage(tenant, except string) Usage {
	var u Usage
	for k, res := range s.pending {
		if k.tenant == tenant && k.digest != except {
			u.Modules++
			u.Bytes += res.size
		}
	}
	return u
}

// admit checks that tenant may keep module d of n bytes, besides what it
// keeps and what its other staged uploads hold; the caller holds s.mu.
func (s *Store) admit(tenant, d string, n int64, q Quota) error {
	u := s.usage(tenant)
	p := s.pendingUsage(tenant, d)
	if q.Modules > 0 && u.Modules+p.Modules+1 > q.Modules {
		return fmt.Errorf("%w: tenant already keeps %d modules (and stages %d), the cap", ErrQuota, u.Modules, p.Modules)
	}
	if b := u.Bytes + p.Bytes + n; q.Bytes > 0 && b > q.Bytes {
		return fmt.Errorf("%w: %d more bytes would put the tenant's modules at %d bytes, over the cap of %d", ErrQuota, n, b, q.Bytes)
	}
	return nil
}

// unstage drops st's hold on its tenant's caps; the caller holds s.mu.
func (s *Store) unstage(st *Staged) {
	if st.had {
		return
	}
	k := refKey{st.tenant, st.digest}
	if res, ok := s.pending[k]; ok {
		if res.stages--; res.stages <= 0 {
			delete(s.pending, k)
		}
	}
}

// Digest returns the staged module's digest, "sha256:<hex>".
func (st *Staged) Digest() string { return st.digest }

// Size returns the staged module's size in bytes.
func (st *Staged) Size() int64 { return st.size }

// Had reports whether the tenant had the module when staging ended: it
// was validated then, and Commit returns that reference unchanged (its
// first name and time stay).
func (st *Staged) Had() bool { return st.had }

// Bytes reads the staged module back, for validation, checking that it
// still hashes to its digest: the upload cap bounds what it holds.
func (st *Staged) Bytes() ([]byte, error) {
	if st.tmp == "" {
		return nil, fmt.Errorf("BUG: reading module %s after its commit or abort", st.digest)
	}
	b, err := os.ReadFile(st.tmp)
	if err != nil {
		return nil, fmt.Errorf("reading staged module %s: %w", st.digest, err)
	}
	if Digest(b) != st.digest {
		return nil, fmt.Errorf("staged module %s is corrupt on disk: its bytes hash to %s", st.digest, Digest(b))
	}
	return b, nil
}

// Commit moves the staged bytes into place (unless another tenant's
// reference keeps them there already) and records the tenant's reference,
// which Has, Get and List then see. A module the tenant has already is
// returned unchanged. Commit checks the caps again, since the tenant may
// have deleted since a staging that had the module. Whatever happens, the
// temp file is gone afterwards.
func (st *Staged) Commit() (Module, error) {
	if st.tmp == "" {
		return Module{}, fmt.Errorf("BUG: committing module %s after its commit or abort", st.digest)
	}
	s, tmp := st.s, st.tmp
	st.tmp = ""
	keep := false
	defer func() {
		if !keep {
			os.Remove(tmp)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.unstage(st)
	if m, ok := s.refs[st.tenant][st.digest]; ok {
		return m, nil
	}
	if err := s.admit(st.tenant, st.digest, st.size, st.q); err != nil {
		return Module{}, err
	}
	hexd, _ := ParseDigest(st.digest)
	dst := s.path(hexd)
	if _, err := os.Stat(dst); err != nil {
		if err := os.Rename(tmp, dst); err != nil {
			return Module{}, fmt.Errorf("storing module %s: %w", st.digest, err)
		}
		keep = true
		if err := syncDir(filepath.Dir(dst)); err != nil {
			return Module{}, fmt.Errorf("storing module %s: %w", st.digest, err)
		}
	}
	if s.afterBytes != nil {
		if err := s.afterBytes(); err != nil {
			return Module{}, err
		}
	}
	m := Module{Digest: st.digest, Name: st.name, Size: st.size, Uploaded: time.Now().UTC().Truncate(time.Millisecond)}
	s.addRef(st.tenant, m)
	if err := s.writeIndex(); err != nil {
		s.dropRef(st.tenant, st.digest)
		return Module{}, err
	}
	return m, nil
}

// Abort removes the staged bytes and gives back what they held of the
// tenant's caps. It does nothing after Commit or Abort, so that a caller
// may defer it.
func (st *Staged) Abort() error {
	if st.tmp == "" {
		return nil
	}
	tmp := st.tmp
	st.tmp = ""
	st.s.mu.Lock()
	st.s.unstage(st)
	st.s.mu.Unlock()
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing staged module %s: %w", st.digest, err)
	}
	return nil
}
