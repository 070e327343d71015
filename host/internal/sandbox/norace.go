//go:build !race

package sandbox

// childRaceFactor is 1 outside race builds (see race.go).
const (
	childRaceFactor = 1
	raceNote        = ""
)
