package wire_test

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/sdk/wire"
)

// TestRoundTrip encodes values as each dtype and decodes them back:
// float32 exactly, the 16-bit floats within their precision.
func TestRoundTrip(t *testing.T) {
	values := []float32{0, 1, -2.5, 3.140625, 65504, -1e-3, float32(math.Inf(1))}
	for _, c := range []struct {
		dt    abi.DType
		bytes int
		tol   float64 // relative
	}{
		{abi.DTypeFloat32, 4, 0},
		{abi.DTypeFloat16, 2, 1e-3},
		{abi.DTypeBFloat16, 2, 1e-2},
	} {
		data := wire.Encode(c.dt, values)
		if len(data) != c.bytes*len(values) {
			t.Fatalf("%v: %d bytes for %d values", c.dt, len(data), len(values))
		}
		got, err := wire.Decode(c.dt, data)
		if err != nil {
			t.Fatalf("%v: %v", c.dt, err)
		}
		for i, v := range values {
			if d := math.Abs(float64(got[i] - v)); !(d <= c.tol*math.Abs(float64(v))) && got[i] != v {
				t.Errorf("%v: value %d is %v, want %v", c.dt, i, got[i], v)
			}
		}
		pb := wire.Tensor([]int64{1, int64(len(values))}, values, c.dt)
		back, err := wire.Values(pb)
		if err != nil || !slices.Equal(back, got) || abi.DType(pb.GetDtype()) != c.dt {
			t.Errorf("%v: Tensor then Values: %v, %v", c.dt, back, err)
		}
	}
	// Little-endian float32, as the proto says.
	if got := wire.Encode(abi.DTypeFloat32, []float32{1}); !slices.Equal(got, []byte{0, 0, 0x80, 0x3f}) {
		t.Errorf("1 as float32: % x", got)
	}
}

// TestDecodeRefuses checks that ragged data and other dtypes fail.
func TestDecodeRefuses(t *testing.T) {
	for _, c := range []struct {
		dt   abi.DType
		data []byte
	}{
		{abi.DTypeFloat32, make([]byte, 6)},
		{abi.DTypeFloat16, make([]byte, 3)},
		{abi.DTypeInt32, make([]byte, 4)},
	} {
		if _, err := wire.Decode(c.dt, c.data); err == nil {
			t.Errorf("%v with %d bytes: no error", c.dt, len(c.data))
		}
	}
}

// FuzzDecode feeds arbitrary bytes: Decode never panics, and what it
// accepts encodes back to the same length.
func FuzzDecode(f *testing.F) {
	f.Add(uint8(abi.DTypeFloat32), []byte{0, 0, 0x80, 0x3f})
	f.Add(uint8(abi.DTypeBFloat16), []byte{0x80, 0x3f, 1})
	f.Fuzz(func(t *testing.T, dt uint8, data []byte) {
		v, err := wire.Decode(abi.DType(dt), data)
		if err != nil {
			return
		}
		if got := wire.Encode(abi.DType(dt), v); len(got) != len(data) {
			t.Fatalf("%v: %d bytes back from %d", abi.DType(dt), len(got), len(data))
		}
	})
}

// TestFloat32Layout: float32 data is little-endian IEEE 754, bit for bit
// (NaN payloads, signed zeros, subnormals), however Encode and Decode
// move it.
func TestFloat32Layout(t *testing.T) {
	values := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(-1)), math.SmallestNonzeroFloat32,
		math.Float32frombits(0x7fc00001), math.Float32frombits(0xffa00000), 1.5, -math.MaxFloat32}
	for i := range 1000 {
		values = append(values, math.Float32frombits(uint32(i)*2654435761))
	}
	want := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(want[4*i:], math.Float32bits(v))
	}
	if got := wire.Encode(abi.DTypeFloat32, values); !slices.Equal(got, want) {
		t.Fatal("Encode's float32 bytes are not the little-endian bits of the values")
	}
	back, err := wire.Decode(abi.DTypeFloat32, want)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range back {
		if math.Float32bits(v) != math.Float32bits(values[i]) {
			t.Fatalf("value %d: decoded bits %#x, want %#x", i, math.Float32bits(v), math.Float32bits(values[i]))
		}
	}
}
