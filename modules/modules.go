// Package modules is the registry of expert modules: a content-addressed
// store of .wasm files on disk, named by their sha256 digest, and an index
// of which tenant uploaded which digest. It stores bytes and references;
// validating a module is host/internal/sandbox's job.
//
// Writes are atomic (temp file, fsync, rename, fsync of the directory), so
// a crash leaves either the whole module or nothing. Bytes are written
// before the index refers to them and unreferenced in the index before they
// are removed, so a crash in between leaves only unreferenced bytes, which
// Open removes.
//
// An upload is staged (Store.Stage): streamed into a temp file in the
// store and hashed, unseen by Has, Get and List, until the host has
// validated it and commits it (Staged.Commit), or aborts it and nothing
// of it stays.
//
// Tenants share bytes but never visibility: two tenants that upload the
// same module each hold a reference, each sees only its own, each is
// charged the module's full size, and the bytes go when the last reference
// does.
package modules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Errors that callers branch on; the errors returned wrap them with
// details.
var (
	// ErrNotFound: no module with that digest is stored (for that tenant).
	ErrNotFound = errors.New("no such module")
	// ErrTooLarge: an upload ran past its size cap.
	ErrTooLarge = errors.New("module too large")
	// ErrQuota: keeping the module would put the tenant over a cap.
	ErrQuota = errors.New("module quota exceeded")
	// ErrInUse: the module is pinned (deployed), so it cannot be deleted.
	ErrInUse = errors.New("module in use")
)

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
