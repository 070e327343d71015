package tests

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/sdk/swarm"
)

// TestSwarmTenantGridDiscoverable serves the README's tenant grids
// (me.linear.[0:2], alice.ffn.[0:4]) from a real `moehost serve` and finds
// them by grid prefix with `moehost discover`; a uid the grammar cannot
// find (ffn.1.x) is refused at startup; and every uid pattern the README
// shows expands to uids that swarm.CheckUID accepts and that are announced
// under a grid prefix.
func TestSwarmTenantGridDiscoverable(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	patterns := regexp.MustCompile(`\b[a-z_]+(?:\.[a-z_]+)*(?:\.(?:\[\d+:\d+\]|\d+))+\b`).FindAllString(string(readme), -1)
	patterns = slices.DeleteFunc(patterns, func(p string) bool { return strings.HasPrefix(p, "libcuda") })
	if len(patterns) < 4 {
		t.Fatalf("found only %v in the README", patterns)
	}
	// The README names these as uids the grammar refuses.
	refused := map[string]bool{"ffn.01": true}
	for _, p := range patterns {
		if refused[p] {
			if swarm.CheckUID(p) == nil {
				t.Errorf("the README says %q is refused, but CheckUID accepts it", p)
			}
			continue
		}
		uids, err := host.ExpandPattern(p)
		if err != nil {
			t.Errorf("README pattern %q: %v", p, err)
			continue
		}
		for _, uid := range uids {
			if err := swarm.CheckUID(uid); err != nil {
				t.Errorf("README uid %q: %v", uid, err)
			}
			if ps, _ := swarm.Prefixes(uid); len(ps) == 0 {
				t.Errorf("README uid %q is announced under no grid prefix", uid)
			}
		}
	}

	s := serve(t, "--experts", "me.linear.[0:2]", "--update-period", "1s")
	for prefix, want := range map[string][]string{"me.linear.": {"me.linear.0", "me.linear.1"}, "me.": nil} {
		var got []string
		waitFor(t, 20*time.Second, "discover "+prefix, func() (bool, string) {
			out, _ := exec.Command(moehostBinary(t), "discover", "--server", s.url, prefix).Output()
			got = nil
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if f := strings.Split(l, "\t"); len(f) == 3 && f[1] == s.url {
					got = append(got, f[0])
				}
			}
			return slices.Equal(got, want), strings.Join(got, ",")
		})
	}

	cmd := exec.Command(moehostBinary(t), "serve", "--listen", "127.0.0.1:*", "--data-dir", t.TempDir(), "--module", "nop", "--experts", "ffn.[0:2].x")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not discoverable") {
		t.Errorf("serve --experts ffn.[0:2].x: %v\n%s", err, out)
	}
}
