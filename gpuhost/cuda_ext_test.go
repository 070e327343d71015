//go:build cuda || cudaemu

package gpuhost_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
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
// nothing stays charged, the refused bytes do not count as a high-water
// mark (which would let the pool grow past what was ever live), and the
// device then runs ops as before.
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
	if after.Refused != before.Refused+1 || after.LiveBytes != before.LiveBytes || after.PoolBytes != 0 || after.PeakBytes != before.PeakBytes {
		t.Errorf("after the refusal: %+v; want one more refusal, live and peak bytes as before (%d, %d) and the pool emptied", after, before.LiveBytes, before.PeakBytes)
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

// TestCUDAHammer runs a small network of the CUDA device's own ops
// (linear, reshape, gelu_tanh, linear, add) forward and backward from
// several goroutines at once, each releasing its tape and gradients after
// every round as the host does: every round's results must equal the
// serial run's bit for bit, and the serial run must agree with the CPU's.
// Reshape's backward hands its gradient on as a view of gy's buffer: the
// tape must see that they share storage (sameStorage) and copy before it
// adds into it, or the gradients of W1 and b1 come out wrong.
func TestCUDAHammer(t *testing.T) {
	t.Parallel()
	var cuda gpuhost.Device
	for _, d := range buildDevices {
		if d.name == "cuda-0" {
			cuda = d.dev
		}
	}
	shapes := [][]int{{6, 16}, {32, 16}, {32}, {16, 16}, {16}}
	run := func(dev gpuhost.Device, seed uint64) ([][]float32, error) {
		rng := rand.New(rand.NewPCG(seed, 3))
		p := make([]*gpuhost.Tensor, len(shapes))
		for i, s := range shapes {
			var err error
			if p[i], err = dev.FromFloat32(s, to32(randVals(rng, numel(s), -1, 1))); err != nil {
				return nil, err
			}
		}
		defer dev.Release(p...)
		var res [][]float32
		for range 3 {
			tape := gpuhost.NewTape()
			h, err := gpuhost.Apply(dev, tape, abi.OpLinear, p[0:3], nil)
			if err == nil {
				h, err = gpuhost.Apply(dev, tape, abi.OpReshape, []*gpuhost.Tensor{h}, []float64{12, 16})
			}
			if err == nil {
				h, err = gpuhost.Apply(dev, tape, abi.OpGeluTanh, []*gpuhost.Tensor{h}, nil)
			}
			var y *gpuhost.Tensor
			if err == nil {
				y, err = gpuhost.Apply(dev, tape, abi.OpLinear, []*gpuhost.Tensor{h, p[3], p[4]}, nil)
			}
			if err == nil {
				y, err = gpuhost.Apply(dev, tape, abi.OpAdd, []*gpuhost.Tensor{y, h}, nil)
			}
			if err != nil {
				return nil, err
			}
			gy, err := dev.FromFloat32(y.Shape(), to32(randVals(rand.New(rand.NewPCG(seed, 4)), y.Len(), -1, 1)))
			if err != nil {
				return nil, err
			}
			g, err := tape.Backward(dev, []*gpuhost.Tensor{y}, []*gpuhost.Tensor{gy}, p)
			if err != nil {
				return nil, err
			}
			res = res[:0]
			for _, x := range append([]*gpuhost.Tensor{y}, g...) {
				v, err := dev.Float32s(x)
				if err != nil {
					return nil, err
				}
				res = append(res, v)
			}
			tape.Release(dev)
			dev.Release(append(g, gy)...)
		}
		return res, nil
	}
	const workers = 4
	want := make([][][]float32, workers)
	for w := range workers {
		var err error
		if want[w], err = run(cuda, uint64(w)); err != nil {
			t.Fatal(err)
		}
		cpu, err := run(gpuhost.NewCPU(1), uint64(w))
		if err != nil {
			t.Fatal(err)
		}
		for i := range cpu {
			for j, v := range cpu[i] {
				if d := math.Abs(float64(want[w][i][j] - v)); d > 1e-4*(1+math.Abs(float64(v))) {
					t.Fatalf("worker %d: result %d element %d is %v on cuda, %v on the CPU", w, i, j, want[w][i][j], v)
				}
			}
		}
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range 3 {
				got, err := run(cuda, uint64(w))
				if err != nil {
					t.Error(err)
					return
				}
				for i := range got {
					if !slices.Equal(got[i], want[w][i]) {
						t.Errorf("worker %d: concurrent result %d differs from the serial one", w, i)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
