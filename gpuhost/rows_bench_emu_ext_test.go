//go:build cudaemu

package gpuhost_test

func init() {
	rowBenchSkip["cuda-0"] = "the emulator runs a GPU's threads one after another on the CPU; its speed says nothing of a GPU's"
}
