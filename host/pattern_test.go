package host_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/moehost/moehost/host"
)

func TestExpandPattern(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern string
		want    string // comma-joined uids, or "error: substring"
	}{
		{"ffn.[0:4]", "ffn.0,ffn.1,ffn.2,ffn.3"},
		{"expert.[0:2].[5:7]", "expert.0.5,expert.0.6,expert.1.5,expert.1.6"},
		{"solo", "solo"},
		{"a.b.[3:4]", "a.b.3"},
		{"", "error: empty"},
		{"ffn.[4:4]", "error: not a range"},
		{"ffn.[a:b]", "error: not a range"},
		{"ffn.[0:4", "error: contains '['"},
		{"ffn..x", "error: empty part"},
		{"mallory.x\n", "error: contains '\\n'"},
		{"mallory.\u202egnp", "error: contains '\\u202e'"},
		{"mallory.a\u200bb", "error: contains '\\u200b'"},
		{"mallory.\xff", "error: contains '�'"},
		{"mallory.a b", "error: contains ' '"},
		{"mallory.a:b", "error: contains ':'"},
		{"Mallory.x-y_Z.0", "Mallory.x-y_Z.0"},
		{"a." + strings.Repeat("x", 300), "error: more than the 256"},
		{"x.[0:1000].[0:1000]", "error: more than"},
	}
	for _, tt := range tests {
		t.Run(tt.pattern, func(t *testing.T) {
			t.Parallel()
			got, err := host.ExpandPattern(tt.pattern)
			if want, ok := strings.CutPrefix(tt.want, "error: "); ok {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, want)
				}
				return
			}
			if err != nil || !slices.Equal(got, strings.Split(tt.want, ",")) {
				t.Fatalf("got %v, %v; want %s", got, err, tt.want)
			}
		})
	}
}
