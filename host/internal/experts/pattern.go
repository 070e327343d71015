package experts

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/moehost/moehost/sdk/swarm"
)

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
	if len(pattern) > swarm.MaxNameLen {
		return nil, fmt.Errorf("expert pattern is %d bytes, more than the %d a uid may have", len(pattern), swarm.MaxNameLen)
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
			if err := swarm.CheckNamePart(part); err != nil {
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
