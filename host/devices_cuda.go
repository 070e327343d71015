//go:build cuda || cudaemu

package host

import "github.com/moehost/moehost/gpuhost"

// cudaBuilt is true in binaries built with the cuda or cudaemu tag.
const cudaBuilt = true

// openCUDA opens GPU ordinal (the CPU emulator's device under cudaemu).
func openCUDA(ordinal int, opts ...gpuhost.DeviceOption) (gpuhost.Device, error) {
	return gpuhost.NewCUDA(ordinal, opts...)
}
