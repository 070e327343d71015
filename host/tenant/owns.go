package tenant

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Errors of ownership. The RPC edge maps ErrNotOwner and ErrOperatorOwned
// to PermissionDenied, ErrInvalidPattern to InvalidArgument, and
// ErrUnknownTenant (a token whose tenant was removed meanwhile) to
// Unauthenticated.
var (
	ErrUnknownTenant  = errors.New("no such tenant")
	ErrNotOwner       = errors.New("uid is outside the tenant's prefixes")
	ErrOperatorOwned  = errors.New("uid belongs to the operator")
	ErrInvalidPattern = errors.New("invalid uid or uid pattern")
)

// wrapped is an error with its own message that matches a sentinel, for
// messages that read better without the sentinel's text.
type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.err }

// patternPart is one dot-separated part of a uid or of a uid pattern
// (hivemind's expert_pattern syntax): a literal, or a half-open range
// "[lo:hi]" of integers.
type patternPart struct {
	lit    string
	lo, hi int
	rng    bool
}

// maxPatternLen bounds the uids and patterns looked at.
const maxPatternLen = 4096

func parsePattern(p string) ([]patternPart, error) {
	if p == "" || len(p) > maxPatternLen {
		return nil, fmt.Errorf("%w: %q is empty or longer than %d bytes", ErrInvalidPattern, trunc(p), maxPatternLen)
	}
	var parts []patternPart
	for s := range strings.SplitSeq(p, ".") {
		if s == "" {
			return nil, fmt.Errorf("%w: %q has an empty part", ErrInvalidPattern, trunc(p))
		}
		if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
			a, b, ok := strings.Cut(s[1:len(s)-1], ":")
			lo, err1 := strconv.Atoi(a)
			hi, err2 := strconv.Atoi(b)
			if !ok || err1 != nil || err2 != nil || lo < 0 || hi <= lo {
				return nil, fmt.Errorf("%w: %q: part %q is not a range [a:b] with 0 <= a < b", ErrInvalidPattern, trunc(p), s)
			}
			parts = append(parts, patternPart{lo: lo, hi: hi, rng: true})
			continue
		}
		if strings.ContainsAny(s, "[]:") {
			return nil, fmt.Errorf("%w: %q: part %q is malformed", ErrInvalidPattern, trunc(p), s)
		}
		parts = append(parts, patternPart{lit: s})
	}
	return parts, nil
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// only reports whether every uid the part stands for is lit.
func (pp patternPart) only(lit string) bool {
	if !pp.rng {
		return pp.lit == lit
	}
	return pp.hi == pp.lo+1 && strconv.Itoa(pp.lo) == lit
}

// may reports whether some uid the part stands for is lit.
func (pp patternPart) may(lit string) bool {
	if !pp.rng {
		return pp.lit == lit
	}
	n, err := strconv.Atoi(lit)
	return err == nil && strconv.Itoa(n) == lit && n >= pp.lo && n < pp.hi
}

// under reports whether every uid of pat is prefix or below it.
func under(pat []patternPart, prefix []string) bool {
	if len(pat) < len(prefix) {
		return false
	}
	for i, p := range prefix {
		if !pat[i].only(p) {
			return false
		}
	}
	return true
}

// touches reports whether some uid of pat is prefix or below it.
func touches(pat []patternPart, prefix []string) bool {
	if len(pat) < len(prefix) {
		return false
	}
	for i, p := range prefix {
		if !pat[i].may(p) {
			return false
		}
	}
	return true
}

// Owns reports whether a tenant owning prefixes owns uidOrPattern: every
// uid it stands for is a prefix or below one at a dot boundary. "alice"
// owns "alice", "alice.x" and "alice.[0:4]", never "alicex.0"; "alice.0"
// owns "alice.[0:1]" but not "alice.[0:2]". A malformed pattern is owned
// by nobody.
func Owns(prefixes []string, uidOrPattern string) bool {
	pat, err := parsePattern(uidOrPattern)
	if err != nil {
		return false
	}
	return ownsParsed(prefixes, pat)
}

func ownsParsed(prefixes []string, pat []patternPart) bool {
	for _, p := range prefixes {
		if under(pat, strings.Split(p, ".")) {
			return true
		}
	}
	return false
}

// Owns reports whether t owns uidOrPattern (see the function Owns).
func (t Tenant) Owns(uidOrPattern string) bool { return Owns(t.Prefixes, uidOrPattern) }

// operator holds the uids and prefixes that the command line deployed or
// reserved: no tenant may deploy over them.
type operator struct {
	uids     map[string]struct{}
	prefixes [][]string
}

func newOperator(uids, prefixes []string) (operator, error) {
	op := operator{uids: make(map[string]struct{}, len(uids))}
	for _, u := range uids {
		if _, err := parsePattern(u); err != nil || strings.ContainsAny(u, "[]") {
			return operator{}, fmt.Errorf("operator uid %q: not a uid", trunc(u))
		}
		op.uids[u] = struct{}{}
	}
	for _, p := range prefixes {
		if err := ValidPrefix(p); err != nil {
			return operator{}, fmt.Errorf("operator prefix: %w", err)
		}
		op.prefixes = append(op.prefixes, strings.Split(p, "."))
	}
	return op, nil
}

// clash returns an operator uid or prefix that pat may stand for, or "".
func (op operator) clash(pat []patternPart) string {
	for _, p := range op.prefixes {
		if touches(pat, p) {
			return strings.Join(p, ".")
		}
	}
	ranged := false
	for _, pp := range pat {
		ranged = ranged || pp.rng
	}
	if !ranged {
		lits := make([]string, len(pat))
		for i, pp := range pat {
			lits[i] = pp.lit
		}
		if u := strings.Join(lits, "."); op.hasUID(u) {
			return u
		}
		return ""
	}
	for u := range op.uids {
		parts := strings.Split(u, ".")
		if len(parts) == len(pat) && touches(pat, parts) {
			return u
		}
	}
	return ""
}

func (op operator) hasUID(u string) bool {
	_, ok := op.uids[u]
	return ok
}
