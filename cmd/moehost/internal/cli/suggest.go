package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// suggestFlag is the commands' flag-error function: an unknown flag gets
// the nearest flag of its command named ("did you mean --hidden-dim?"),
// as cobra does for mistyped commands (SuggestionsMinimumDistance) but not
// for flags.
func suggestFlag(cmd *cobra.Command, err error) error {
	const prefix = "unknown flag: --"
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return err
	}
	typed := strings.TrimPrefix(msg, prefix)
	if near := nearestFlag(cmd, typed); near != "" {
		return fmt.Errorf("%w; did you mean --%s?", err, near)
	}
	return err
}

// nearestFlag returns the name of cmd's flag (its own or inherited)
// closest to typed, within an edit distance of 2 (or a third of its
// length, for long names), or "" when none is that close. Ties go to the
// first in name order.
func nearestFlag(cmd *cobra.Command, typed string) string {
	best, bestD := "", -1
	visit := func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(typed, f.Name)
		if d > max(2, len(f.Name)/3) {
			return
		}
		if bestD < 0 || d < bestD || d == bestD && f.Name < best {
			best, bestD = f.Name, d
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes
// (flag names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
