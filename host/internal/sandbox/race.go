//go:build race

package sandbox

// childRaceFactor scales a compile child's memory limit in a race build:
// ThreadSanitizer maps shadow memory for the heap and the binary's data,
// and RLIMIT_DATA counts those mappings too (a small module's compile in
// the race-built CLI tests needed more than 500 MB of them).
const (
	childRaceFactor = 8
	raceNote        = ", times 8 under the race detector"
)
