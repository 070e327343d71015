//go:build !linux

package cpu

// AdviseHuge does nothing where there is no transparent huge page advice.
func AdviseHuge([]float32) {}
