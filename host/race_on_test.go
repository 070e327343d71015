//go:build race

package host

// raceEnabled: the race detector keeps shadow memory that the process
// never returns, so RSS checks mean nothing under it.
const raceEnabled = true
