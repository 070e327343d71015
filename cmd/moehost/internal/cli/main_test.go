package cli

import (
	"os"
	"testing"

	"github.com/moehost/moehost/host"
)

// TestMain serves as the compile child that `serve` (run in process by
// these tests) starts, as moehost's main does.
func TestMain(m *testing.M) {
	if code, ok := host.CompileChildMain(os.Args[1:]); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// skipUnderRace skips an end-to-end CLI test in a race build (see
// race_on_test.go).
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("end to end through compile children: make test runs it without -race (make test-e2e)")
	}
}
