package gpuhost_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/gpuhost"
)

// TestCastExact checks cast's conversions bit for bit on every device:
// integers round to the nearest float32 with ties to even (2^24 + 1 and
// 2^24 + 3 are ties), the int64 extremes, and a bool's nonzero bytes all
// give 1, with a gradient through a float32 x and none to the others.
func TestCastExact(t *testing.T) {
	t.Parallel()
	i64 := []int64{0, 1, -1, 2, 1<<24 + 1, 1<<24 + 3, -(1<<24 + 1), 1<<53 + 1, math.MaxInt64, math.MinInt64, 123456789}
	w64 := []float32{0, 1, -1, 2, 1 << 24, 1<<24 + 4, -(1 << 24), 1 << 53, 1 << 63, -(1 << 63), 123456792}
	i32 := []int32{0, 7, -7, 1<<24 + 1, 1<<24 + 3, math.MaxInt32, math.MinInt32}
	w32 := []float32{0, 7, -7, 1 << 24, 1<<24 + 4, 1 << 31, -(1 << 31)}
	bools := []byte{0, 1, 2, 255, 0, 128}
	wb := []float32{0, 1, 1, 1, 0, 1}
	for _, d := range devices() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			b64 := make([]byte, 8*len(i64))
			for i, v := range i64 {
				binary.LittleEndian.PutUint64(b64[8*i:], uint64(v))
			}
			b32 := make([]byte, 4*len(i32))
			for i, v := range i32 {
				binary.LittleEndian.PutUint32(b32[4*i:], uint32(v))
			}
			for _, c := range []struct {
				dt   abi.DType
				data []byte
				want []float32
			}{
				{abi.DTypeInt64, b64, w64},
				{abi.DTypeInt32, b32, w32},
				{abi.DTypeBool, bools, wb},
			} {
				x, err := d.dev.FromBytes(c.dt, []int{len(c.want)}, c.data)
				if err != nil {
					t.Fatal(err)
				}
				y, err := gpuhost.Apply(d.dev, nil, abi.OpCast, []*gpuhost.Tensor{x}, nil)
				if err != nil {
					t.Fatalf("cast %s: %v", c.dt, err)
				}
				if y.DType() != abi.DTypeFloat32 || len(y.Shape()) != 1 || y.Shape()[0] != len(c.want) {
					t.Fatalf("cast %s: result %s%v, want float32[%d]", c.dt, y.DType(), y.Shape(), len(c.want))
				}
				got := mustFloats(t, d.dev, y)
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(c.want[i]) {
						t.Errorf("cast %s: element %d = %v, want %v", c.dt, i, got[i], c.want[i])
					}
				}
				d.dev.Release(x, y)
			}

			// A float32 x: copied, and its gradient is the output's.
			x := mustTensor(t, d.dev, []int{2, 2}, []float64{1.5, -2, 0, 3})
			tape := gpuhost.NewTape()
			y, err := gpuhost.Apply(d.dev, tape, abi.OpCast, []*gpuhost.Tensor{x}, []float64{float64(abi.DTypeFloat32)})
			if err != nil {
				t.Fatal(err)
			}
			if got := mustFloats(t, d.dev, y); got[0] != 1.5 || got[1] != -2 || got[3] != 3 {
				t.Errorf("cast float32: %v", got)
			}
			gy := mustTensor(t, d.dev, []int{2, 2}, []float64{4, 5, 6, 7})
			g, err := tape.Backward(d.dev, []*gpuhost.Tensor{y}, []*gpuhost.Tensor{gy}, []*gpuhost.Tensor{x})
			if err != nil {
				t.Fatal(err)
			}
			if got := mustFloats(t, d.dev, g[0]); got[0] != 4 || got[1] != 5 || got[2] != 6 || got[3] != 7 {
				t.Errorf("cast float32: gradient %v, want the output's [4 5 6 7]", got)
			}
		})
	}
}
