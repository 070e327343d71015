package tests

import (
	"os"
	"testing"
)

// TestMain removes the moehost binary that tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}
