//go:build race

package cli

// raceEnabled: the end-to-end CLI tests (serve, bench, expert build) skip
// themselves under -race, where every compile child is the race-built
// test binary and each took minutes of CPU; make test runs them in its
// run without the detector (make test-e2e). The servers they start are
// host.Servers, which host's own tests run under -race.
const raceEnabled = true
