//go:build race

package tests

// raceEnabled: the tests that run moehost serve in a child process skip
// themselves under -race (the child is not built with it, so the detector
// would watch only the test's client); make test runs them without it.
const raceEnabled = true
