//go:build cuda || cudaemu

package gpuhost_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// The CUDA device joins the device table (on the CPU emulator under
// -tags cudaemu).
func init() {
	dev, err := gpuhost.NewCUDA(0)
	if err != nil {
		panic(err)
	}
	buildDevices = append(buildDevices, testDevice{name: "cuda-0", dev: dev})
}

// TestCUDAOutOfMemory runs an op whose output the GPU cannot hold (1 TiB,
// past the emulator's default 4 GiB and any GPU's memory): the op fails
// with ErrOutOfMemory, its pooled buffers went back to the GPU on the way,
// nothing stays charged, and the device then runs ops as before.
func TestCUDAOutOfMemory(t *testing.T) {
	dev, err := gpuhost.NewCUDA(0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 19 // n×n floats: 1 TiB
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	a, err := dev.FromFloat32([]int{n, 1}, ones)
	if err != nil {
		t.Fatal(err)
	}
	b, err := dev.FromFloat32([]int{1, n}, ones)
	if err != nil {
		t.Fatal(err)
	}
	spare := mustZeros(t, dev, abi.DTypeFloat32, 1000)
	dev.Release(spare)
	before := dev.MemStats()
	if before.PoolBytes == 0 {
		t.Fatal("the released tensor is not pooled")
	}
	_, err = gpuhost.Apply(dev, nil, abi.OpMatMul, []*gpuhost.Tensor{a, b}, nil)
	if !errors.Is(err, gpuhost.ErrOutOfMemory) {
		t.Fatalf("matmul with a 1 TiB output: err = %v, want ErrOutOfMemory", err)
	}
	after := dev.MemStats()
	if after.Refused != before.Refused+1 || after.LiveBytes != before.LiveBytes || after.PoolBytes != 0 {
		t.Errorf("after the refusal: %+v; want one more refusal, live bytes as before (%d) and the pool emptied", after, before.LiveBytes)
	}
	// The device carries on: a small matmul gives the right answer.
	x, err := dev.FromFloat32([]int{2, 3}, []float32{1, 2, 3, 4, 5, 6})
	if err != nil {
		t.Fatal(err)
	}
	y, err := dev.FromFloat32([]int{3, 2}, []float32{1, 0, 0, 1, 1, 1})
	if err != nil {
		t.Fatal(err)
	}
	z, err := gpuhost.Apply(dev, nil, abi.OpMatMul, []*gpuhost.Tensor{x, y}, nil)
	if err != nil {
		t.Fatalf("matmul after the refusal: %v", err)
	}
	if got, want := mustFloats(t, dev, z), []float32{4, 5, 10, 11}; !slices.Equal(got, want) {
		t.Errorf("matmul after the refusal = %v, want %v", got, want)
	}
	dev.Release(a, b, x, y, z)
}

// TestCUDACeiling checks that the CUDA device charges the shared ceiling
// before it allocates device memory, and gives the bytes back on Release.
func TestCUDACeiling(t *testing.T) {
	c := gpuhost.NewCeiling(1 << 20)
	dev, err := gpuhost.NewCUDA(0, gpuhost.WithCeiling(c))
	if err != nil {
		t.Fatal(err)
	}
	x := mustZeros(t, dev, abi.DTypeFloat32, 128, 1024) // 512 KiB
	if _, err := dev.Zeros(abi.DTypeFloat32, []int{160, 1024}); !errors.Is(err, gpuhost.ErrOutOfMemory) {
		t.Fatalf("640 KiB more under a 1 MiB ceiling: %v, want ErrOutOfMemory", err)
	}
	if _, err := gpuhost.Apply(dev, nil, abi.OpScale, []*gpuhost.Tensor{x}, []float64{2}); err != nil {
		t.Fatalf("512 KiB more: %v", err)
	}
	if got := c.Used(); got != 1<<20 {
		t.Errorf("ceiling used %d bytes, want %d", got, 1<<20)
	}
	if s := dev.MemStats(); s.Refused != 1 || s.LiveBytes != 1<<20 {
		t.Errorf("MemStats %+v, want 1 refusal and 1 MiB live", s)
	}
	dev.Release(x)
	if got := c.Used(); got != 512<<10 {
		t.Errorf("ceiling used %d bytes after a release, want %d", got, 512<<10)
	}
}
