//go:build (amd64 && !purego) || openblas

package cpu

// fmaLoop, where the build has one (amd64), runs n groups of FMAs on
// registers, fmaLoopFlop flop each: fmaCeiling's loop in the openblas
// build's kernel table. Builds that neither set nor read it leave it out.
var (
	fmaLoop     func(n int)
	fmaLoopFlop int
)
