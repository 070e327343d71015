package cli

import (
	"os"
	"testing"

	"github.com/moehost/moehost/host"
	"github.com/moehost/moehost/internal/testing/racebuild"
)

// TestMain serves as the compile child that `serve` (run in process by
// these tests) starts, as moehost's main does.
func TestMain(m *testing.M) {
	if code, ok := host.CompileChildMain(os.Args[1:]); ok {
		os.Exit(code)
	}
	// As the server child of `bench --child --server-exe` (TestBenchChildBuilds).
	if os.Getenv(asMoehostEnv) == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// asMoehostEnv set to 1 makes the test binary run as moehost itself.
const asMoehostEnv = "MOEHOST_CLI_TEST_AS_MAIN"

// skipUnderRace skips an end-to-end CLI test (serve, bench, expert build)
// in a race build, where every compile child is the race-built test
// binary and each took minutes of CPU; make test runs them in its run
// without the detector (make test-e2e). The servers they start are
// host.Servers, which host's own tests run under -race.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if racebuild.Enabled {
		t.Skip("end to end through compile children: make test runs it without -race (make test-e2e)")
	}
}
