package experts

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxUIDBytes bounds a uid (and a pattern): as long as the longest uid
// prefix a tenant may own.
const MaxUIDBytes = 256

// checkUIDPart accepts one dot-separated part of a uid: non-empty, and
// made of the characters of a tenant's uid prefixes (A-Z, a-z, 0-9, '-'
// and '_'), so that no uid carries control or format characters (a
// newline in a log line, an RTL override in a listing).
func checkUIDPart(part string) error {
	if part == "" {
		return errors.New("a uid has an empty part (a leading, trailing or doubled dot)")
	}
	for _, c := range part {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("uid part %q contains %q; use A-Z, a-z, 0-9, '-' and '_', with '.' between parts", part, c)
		}
	}
	return nil
}

// CheckUID returns an error unless uid is a uid that ExpandPattern could
// have made: parts of A-Z, a-z, 0-9, '-' and '_' between dots, at most
// MaxUIDBytes in all.
func CheckUID(uid string) error {
	if len(uid) > MaxUIDBytes {
		return fmt.Errorf("uid is %d bytes, more than %d", len(uid), MaxUIDBytes)
	}
	for part := range strings.SplitSeq(uid, ".") {
		if err := checkUIDPart(part); err != nil {
			return err
		}
	}
	return nil
}

// maxPatternUIDs bounds what one pattern may expand to.
const maxPatternUIDs = 1 << 16

// ExpandPattern expands hivemind's expert_pattern syntax into uids: the
// pattern is split on ".", and each part is either literal or a half-open
// range "[a:b]". "ffn.[0:4]" gives ffn.0 … ffn.3; "expert.[0:2].[5:7]"
// gives expert.0.5, expert.0.6, expert.1.5, expert.1.6. Unlike hivemind,
// which samples a number of uids from the grid, it returns the whole grid.
func ExpandPattern(pattern string) ([]string, error) {
	if pattern == "" {
		return nil, fmt.Errorf("expert pattern is empty")
	}
	if len(pattern) > MaxUIDBytes {
		return nil, fmt.Errorf("expert pattern is %d bytes, more than the %d a uid may have", len(pattern), MaxUIDBytes)
	}
	uids := []string{""}
	for i, part := range strings.Split(pattern, ".") {
		var choices []string
		if strings.HasPrefix(part, "[") && strings.HasSuffix(part, "]") {
			lo, hi, ok := strings.Cut(part[1:len(part)-1], ":")
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if !ok || err1 != nil || err2 != nil || a < 0 || b <= a {
				return nil, fmt.Errorf("expert pattern %q: part %q is not a range [a:b] with 0 <= a < b", pattern, part)
			}
			if len(uids)*(b-a) > maxPatternUIDs || b-a > maxPatternUIDs {
				return nil, fmt.Errorf("expert pattern %q expands to more than %d uids", pattern, maxPatternUIDs)
			}
			for v := a; v < b; v++ {
				choices = append(choices, strconv.Itoa(v))
			}
		} else {
			if err := checkUIDPart(part); err != nil {
				return nil, fmt.Errorf("expert pattern %q: %w", pattern, err)
			}
			choices = []string{part}
		}
		next := make([]string, 0, len(uids)*len(choices))
		for _, u := range uids {
			for _, c := range choices {
				if i > 0 {
					next = append(next, u+"."+c)
				} else {
					next = append(next, c)
				}
			}
		}
		uids = next
	}
	return uids, nil
}
