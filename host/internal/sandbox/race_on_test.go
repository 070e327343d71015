//go:build race

package sandbox

// raceEnabled: the tests that compile the Go examples in a compile child,
// or the adversarial shapes, skip themselves in a race build, where the
// child is the race-built test binary and each compile took minutes of
// CPU beside the rest of make test; make test runs them without the
// detector (make test-compile). The detector has nothing to watch there: a
// compile runs on one goroutine, or in another process.
const raceEnabled = true
