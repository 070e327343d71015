// Package modules is the registry of expert modules: a content-addressed
// store of .wasm files on disk, named by their sha256 digest. Writes are
// atomic (temp file, fsync, rename, fsync of the directory), so a crash
// leaves either the whole module or nothing.
package modules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrNotFound: no module with that digest is stored.
var ErrNotFound = errors.New("module not found")

// DigestPrefix starts every digest.
const DigestPrefix = "sha256:"

// Digest returns the digest of a module's bytes, "sha256:<hex>".
func Digest(wasm []byte) string {
	sum := sha256.Sum256(wasm)
	return DigestPrefix + hex.EncodeToString(sum[:])
}

// ParseDigest checks that d is "sha256:" and 64 lower-case hex digits, and
// returns the hex part.
func ParseDigest(d string) (string, error) {
	h, ok := strings.CutPrefix(d, DigestPrefix)
	if !ok || len(h) != 64 {
		return "", fmt.Errorf("digest %q is not sha256:<64 hex digits>", d)
	}
	for _, c := range h {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", fmt.Errorf("digest %q is not sha256:<64 lower-case hex digits>", d)
		}
	}
	return h, nil
}

// Store keeps modules under a directory.
type Store struct {
	dir string
}

// Open opens (creating it if needed) the store in dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(filepath.Join(dir, "sha256"), 0o755); err != nil {
		return nil, fmt.Errorf("opening module store: %w", err)
	}
	return &Store{dir: dir}, nil
}

func (s *Store) path(hexDigest string) string {
	return filepath.Join(s.dir, "sha256", hexDigest+".wasm")
}

// Put stores wasm and returns its digest. Storing a module twice is cheap.
func (s *Store) Put(wasm []byte) (string, error) {
	d := Digest(wasm)
	h, _ := ParseDigest(d)
	dst := s.path(h)
	if _, err := os.Stat(dst); err == nil {
		return d, nil
	}
	if err := WriteFileAtomic(dst, wasm); err != nil {
		return "", fmt.Errorf("storing module %s: %w", d, err)
	}
	return d, nil
}

// Get returns the module with digest d, checking that its bytes still
// match it.
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

// WriteFileAtomic writes data to path so that readers see the old file or
// the whole new one, even across a crash: a temp file in the same
// directory, fsync, rename, fsync of the directory. Checkpoints use it too.
func WriteFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
