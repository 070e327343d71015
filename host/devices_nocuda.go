//go:build !cuda && !cudaemu

package host

import "github.com/moehost/moehost/gpuhost"

// cudaBuilt is false without the cuda and cudaemu tags: validateDevice
// refuses CUDA specs, so openCUDA is never reached.
const cudaBuilt = false

func openCUDA(int, ...gpuhost.DeviceOption) (gpuhost.Device, error) { return nil, errNoCUDA }
