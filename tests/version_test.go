package tests

import (
	"os/exec"
	"strings"
	"testing"
)

// TestVersionStamped checks that a binary built as make build builds it,
// without Go's VCS stamping, names the commit it was built from.
func TestVersionStamped(t *testing.T) {
	t.Parallel()
	head, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		t.Skip("not a git checkout:", err)
	}
	bin := buildMoehost(t, "")
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("moehost version: %v\n%s", err, out)
	}
	if want := "moehost "; !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), " "+strings.TrimSpace(string(head))) {
		t.Errorf("moehost version printed %q, want the commit %s", out, head)
	}
	if strings.Contains(string(out), "(devel)") {
		t.Errorf("moehost version printed %q, want the Makefile's version", out)
	}
}
