package tests

import (
	"os/exec"
	"strings"
	"testing"
)

// TestWebTargetsInstallWhatTheyNeed dry-runs the targets that compile
// sdk/ts's sources (the dashboard's build and its browser tests) and checks
// that each installs sdk/ts's packages itself, before it compiles, so that
// it works alone on a fresh clone.
func TestWebTargetsInstallWhatTheyNeed(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make:", err)
	}
	for _, target := range []string{"test-web", "ui"} {
		out, err := exec.Command("make", "-n", "-C", "..", "--no-print-directory", target).CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		s := string(out)
		ts := strings.Index(s, "cd sdk/ts && npm ci")
		own := strings.Index(s, "npm run build")
		if target == "test-web" {
			own = strings.Index(s, "npm test")
		}
		if ts < 0 || own < 0 || ts > own {
			t.Errorf("make %s does not install sdk/ts's packages before it compiles:\n%s", target, s)
		}
	}
}
