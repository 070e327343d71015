//go:build openblas && cgo

package gpuhost_test

import "github.com/moehost/moehost/gpuhost"

func init() {
	buildDevices = append(buildDevices, testDevice{name: "cpu-openblas-2", dev: gpuhost.NewOpenBLAS(2)})
}
