package gpuhost_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// TestRelease checks the device's reuse of released storage: a reused
// buffer comes back zeroed from Zeros, pinned and foreign tensors are left
// alone, and releasing twice or nil is harmless.
func TestRelease(t *testing.T) {
	t.Parallel()
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			dev, other := d.dev, gpuhost.NewCPU(1)
			a := mustTensor(t, dev, []int{3, 5}, randVals(rand.New(rand.NewPCG(1, 1)), 15, 1, 2))
			p := mustTensor(t, dev, []int{3, 5}, randVals(rand.New(rand.NewPCG(1, 2)), 15, 1, 2))
			p.Pin()
			o := mustTensor(t, other, []int{3, 5}, randVals(rand.New(rand.NewPCG(1, 3)), 15, 1, 2))
			want := mustFloats(t, dev, p)
			dev.Release(a, p, o, nil)
			dev.Release(a) // twice
			z, err := dev.Zeros(abi.DTypeFloat32, []int{15})
			if err != nil {
				t.Fatal(err)
			}
			if got := mustFloats(t, dev, z); slices.ContainsFunc(got, func(v float32) bool { return v != 0 }) {
				t.Errorf("Zeros after a release = %v, want zeros", got)
			}
			if got := mustFloats(t, dev, p); !slices.Equal(got, want) {
				t.Errorf("pinned tensor changed after Release: %v, want %v", got, want)
			}
			if _, err := other.Float32s(o); err != nil {
				t.Errorf("another device's tensor was released: %v", err)
			}

			// A double release must not put one buffer in the pool twice: the
			// next two tensors of its size would share storage.
			b := mustTensor(t, dev, []int{7}, randVals(rand.New(rand.NewPCG(1, 4)), 7, 1, 2))
			dev.Release(b)
			dev.Release(b)
			x, y := []float32{1, 2, 3, 4, 5, 6, 7}, []float32{-1, -2, -3, -4, -5, -6, -7}
			tx, err := dev.FromFloat32([]int{7}, x)
			if err != nil {
				t.Fatal(err)
			}
			ty, err := dev.FromFloat32([]int{7}, y)
			if err != nil {
				t.Fatal(err)
			}
			if got := mustFloats(t, dev, tx); !slices.Equal(got, x) {
				t.Errorf("after a double release, a new tensor holds %v, want %v: two tensors share storage", got, x)
			}
			if got := mustFloats(t, dev, ty); !slices.Equal(got, y) {
				t.Errorf("after a double release, a new tensor holds %v, want %v", got, y)
			}
		})
	}
}

// TestTapeReleaseReuse runs the ffn's forward and backward three times,
// releasing the tape and the gradients after each, as the host does for
// every batch: storage that comes back from the pool must not change a
// single bit of the results.
func TestTapeReleaseReuse(t *testing.T) {
	t.Parallel()
	shapes := ffnShapes(5, 16)
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(9, 9))
			p := make([]*gpuhost.Tensor, len(shapes))
			for i, s := range shapes {
				p[i] = mustTensor(t, d.dev, s, randVals(rng, numel(s), -1, 1))
			}
			gyv := randVals(rng, numel(shapes[0]), -1, 1)
			var first [][]float32
			for round := range 3 {
				tape := gpuhost.NewTape()
				out, err := applyFFN(d.dev, tape, p, 1e-5)
				if err != nil {
					t.Fatal(err)
				}
				gy := mustTensor(t, d.dev, out.Shape(), gyv)
				grads, err := tape.Backward(d.dev, []*gpuhost.Tensor{out}, []*gpuhost.Tensor{gy}, p)
				if err != nil {
					t.Fatal(err)
				}
				got := [][]float32{mustFloats(t, d.dev, out)}
				for _, g := range grads {
					got = append(got, mustFloats(t, d.dev, g))
				}
				tape.Release(d.dev)
				d.dev.Release(append(grads, gy)...)
				if round == 0 {
					first = got
					continue
				}
				for i := range got {
					if !slices.Equal(got[i], first[i]) {
						t.Fatalf("round %d: result %d differs from round 0", round, i)
					}
				}
			}
		})
	}
}
