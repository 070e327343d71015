//go:build cuda || cudaemu

package gpuhost_test

import "github.com/moehost/moehost/gpuhost"

// The CUDA device joins the device table (on the CPU emulator under
// -tags cudaemu).
func init() {
	dev, err := gpuhost.NewCUDA(0)
	if err != nil {
		panic(err)
	}
	buildDevices = append(buildDevices, testDevice{name: "cuda-0", dev: dev})
}
