package tenant

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
)

// TokenPrefix starts every token, so that a leaked token is easy to find
// (grep, secret scanners) and easy to tell from other secrets.
const TokenPrefix = "moe_"

// tokenBytes is the randomness in a token: 256 bits.
const tokenBytes = 32

// TokenLen is the length of a token: TokenPrefix and 43 characters of
// unpadded URL-safe base64 (A-Z, a-z, 0-9, '-', '_').
const TokenLen = len(TokenPrefix) + (tokenBytes*8+5)/6

// hashPrefix starts a stored token hash.
const hashPrefix = "sha256:"

// tokenHash is the SHA-256 of a token.
type tokenHash [sha256.Size]byte

func (h tokenHash) String() string { return hashPrefix + hex.EncodeToString(h[:]) }

func parseTokenHash(s string) (tokenHash, error) {
	var h tokenHash
	x, ok := strings.CutPrefix(s, hashPrefix)
	if !ok || len(x) != 2*len(h) {
		return h, fmt.Errorf("not %s<64 lower-case hex digits>", hashPrefix)
	}
	if _, err := hex.Decode(h[:], []byte(x)); err != nil || hex.EncodeToString(h[:]) != x {
		return h, fmt.Errorf("not %s<64 lower-case hex digits>", hashPrefix)
	}
	return h, nil
}

func hashToken(token string) tokenHash { return sha256.Sum256([]byte(token)) }

// newToken returns a fresh token from crypto/rand and its hash.
func newToken() (string, tokenHash, error) {
	var b [tokenBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", tokenHash{}, fmt.Errorf("generating a token: %w", err)
	}
	t := TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return t, hashToken(t), nil
}

// wellFormed reports whether token has a token's shape. It looks at the
// token alone, so its timing tells nothing about stored tokens.
func wellFormed(token string) bool {
	if len(token) != TokenLen || !strings.HasPrefix(token, TokenPrefix) {
		return false
	}
	for _, c := range []byte(token[len(TokenPrefix):]) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// constantTimeEqual compares two hashes in time independent of their
// contents. A variable so that a test can check that every stored hash is
// compared, whichever matches.
var constantTimeEqual = func(a, b *tokenHash) bool { return subtle.ConstantTimeCompare(a[:], b[:]) == 1 }
