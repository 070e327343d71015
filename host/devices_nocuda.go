package host

import "github.com/moehost/moehost/gpuhost"

// cudaBuilt is false until the CUDA device is wired in: validateDevice
// refuses CUDA specs, so openCUDA is never reached.
const cudaBuilt = false

func openCUDA(int) (gpuhost.Device, error) { return nil, errNoCUDA }
