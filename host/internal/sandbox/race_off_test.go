//go:build !race

package sandbox

// raceEnabled is false outside race builds (see race_on_test.go).
const raceEnabled = false
