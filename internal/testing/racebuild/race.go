//go:build race

// Package racebuild tells a test whether it runs in a race build, where
// some checks mean nothing (allocation counts, RSS: the detector allocates
// and maps shadow memory on its own account) and some runs cost minutes
// (compile children that are the race-built test binary), so that make
// test runs those without the detector instead.
package racebuild

// Enabled reports whether the binary was built with -race.
const Enabled = true
