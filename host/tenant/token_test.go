package tenant

import (
	"encoding/base64"
	"path/filepath"
	"testing"
)

// TestAuthenticateComparesEveryHash checks that Authenticate goes through
// the constant-time comparison for every stored hash, whether the token
// matches the first, the last or none: no early exit tells a caller how
// far down the list its token got.
func TestAuthenticateComparesEveryHash(t *testing.T) {
	var f File
	var tokens []string
	for _, name := range []string{"a", "b", "c", "d"} {
		tok, err := f.Add(name, []string{name}, Caps{})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tok)
	}
	if _, err := f.Rotate("c", true); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), FileName)
	if err := f.Save(path); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const stored = 5
	calls := 0
	orig := constantTimeEqual
	constantTimeEqual = func(a, b *tokenHash) bool { calls++; return orig(a, b) }
	defer func() { constantTimeEqual = orig }()

	wrong, _, err := newToken()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ token, want string }{
		{tokens[0], "a"}, {tokens[3], "d"}, {tokens[2], "c"}, {wrong, ""},
	} {
		calls = 0
		name, ok := s.Authenticate(tc.token)
		if name != tc.want || ok != (tc.want != "") {
			t.Errorf("Authenticate = %q, %v; want %q", name, ok, tc.want)
		}
		if calls != stored {
			t.Errorf("token of %q: %d constant-time comparisons, want one per stored hash (%d)", tc.want, calls, stored)
		}
	}
}

func TestTokenHashRoundTrip(t *testing.T) {
	t.Parallel()
	tok, h, err := newToken()
	if err != nil {
		t.Fatal(err)
	}
	if hashToken(tok) != h {
		t.Fatal("newToken's hash is not the token's")
	}
	g, err := parseTokenHash(h.String())
	if err != nil || g != h {
		t.Fatalf("parseTokenHash(%q) = %x, %v", h.String(), g, err)
	}
	if !wellFormed(tok) || len(tok) != TokenLen || TokenLen != 47 || TokenLen != len(TokenPrefix)+base64.RawURLEncoding.EncodedLen(tokenBytes) {
		t.Errorf("token %q (%d bytes) is not well formed", tok, len(tok))
	}
}
