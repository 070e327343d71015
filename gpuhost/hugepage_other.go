//go:build !linux

package gpuhost

// adviseHuge does nothing where there is no transparent huge page advice.
func adviseHuge([]float32) {}
