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
