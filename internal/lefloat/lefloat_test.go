package lefloat

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestFloat32Bytes: the memmove and the portable loop agree bit for bit
// both ways, NaN payloads, infinities, zeros and subnormals included.
func TestFloat32Bytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	f := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7fc00001), math.Float32frombits(0xffa00000), math.SmallestNonzeroFloat32, math.MaxFloat32}
	for range 1021 {
		f = append(f, math.Float32frombits(rng.Uint32()))
	}
	want := make([]byte, 4*len(f))
	putLoop(want, f)
	got := make([]byte, 4*len(f))
	Put(got, f)
	if !bytes.Equal(got, want) {
		t.Fatal("Put and the loop disagree")
	}
	back := make([]float32, len(f))
	Get(back, want)
	wantBack := make([]float32, len(f))
	getLoop(wantBack, want)
	bits := func(f []float32) []uint32 {
		out := make([]uint32, len(f))
		for i, v := range f {
			out[i] = math.Float32bits(v)
		}
		return out
	}
	if !slices.Equal(bits(back), bits(wantBack)) || !slices.Equal(bits(back), bits(f)) {
		t.Fatal("Get, the loop and the values disagree")
	}
	Put(nil, nil) // empty slices copy nothing
	Get(nil, nil)
}
