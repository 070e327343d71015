package hivemind

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// uidPattern is hivemind's UID_PATTERN: a type without dots, then one or
// more dot-separated coordinates without leading zeros.
var uidPattern = regexp.MustCompile(`^[^.]+(\.(0|[1-9][0-9]*))+$`)

// CheckGridUID refuses a uid a hivemind client could not find (hivemind's
// is_valid_uid), naming the grammar.
func CheckGridUID(uid string) error {
	if !uidPattern.MatchString(uid) {
		return fmt.Errorf("uid %q is not a hivemind expert uid: want a type without dots and one or more coordinates without leading zeros, as in \"ffn.3\" or \"ffn.0.12\"", uid)
	}
	for _, c := range strings.Split(uid, ".")[1:] {
		if _, err := strconv.ParseInt(c, 10, 64); err != nil {
			return fmt.Errorf("uid %q: coordinate %q does not fit in 64 bits", uid, c)
		}
	}
	return nil
}

type prefixCoord struct {
	prefix string
	coord  int64
}

// prefixes are the grid prefixes hivemind's declare_experts stores for a
// valid uid, deepest first: "ffn.1.2.3" → ("ffn.1.2.", 3), ("ffn.1.", 2);
// a one-dimensional "ffn.5" → ("ffn.5.", -1).
func prefixes(uid string) []prefixCoord {
	p := uid
	if strings.Count(uid, ".") <= 1 {
		p = uid + ".-1"
	}
	var out []prefixCoord
	for range strings.Count(p, ".") - 1 {
		i := strings.LastIndexByte(p, '.')
		c, _ := strconv.ParseInt(p[i+1:], 10, 64)
		p = p[:i+1]
		out = append(out, prefixCoord{p, c})
		p = p[:i]
	}
	return out
}
