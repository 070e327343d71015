package half_test

import (
	"math"
	"testing"

	"github.com/moehost/moehost/abi"
	"github.com/moehost/moehost/abi/half"
)

func pow2(e int) float32 { return float32(math.Ldexp(1, e)) }

func TestFloat16(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"zero", 0, 0x0000},
		{"minus zero", float32(math.Copysign(0, -1)), 0x8000},
		{"tenth rounds down", 0.1, 0x2e66},
		{"tie to even stays", 1 + pow2(-11), 0x3c00},
		{"tie to even rounds up", 1 + 3*pow2(-11), 0x3c02},
		{"above tie", 1 + pow2(-11) + pow2(-20), 0x3c01},
		{"largest finite", 65504, 0x7bff},
		{"below overflow tie", 65519, 0x7bff},
		{"overflow tie to inf", 65520, 0x7c00},
		{"overflow", 1e6, 0x7c00},
		{"minus overflow", -1e6, 0xfc00},
		{"inf", float32(math.Inf(1)), 0x7c00},
		{"minus inf", float32(math.Inf(-1)), 0xfc00},
		{"smallest normal", pow2(-14), 0x0400},
		{"largest subnormal", 1023 * pow2(-24), 0x03ff},
		{"smallest subnormal", pow2(-24), 0x0001},
		{"subnormal tie to even zero", pow2(-25), 0x0000},
		{"subnormal above tie", pow2(-25) * (1 + pow2(-20)), 0x0001},
		{"subnormal tie to even up", 3 * pow2(-25), 0x0002},
		{"subnormal rounds into normal", 1023.5*pow2(-24) + pow2(-40), 0x0400},
		{"underflow", pow2(-30), 0x0000},
		{"minus underflow", -pow2(-30), 0x8000},
		{"float32 subnormal", math.Float32frombits(1), 0x0000},
	}
	for _, tt := range tests {
		if got := half.Float16(tt.in); got != tt.want {
			t.Errorf("%s: Float16(%g) = %#04x, want %#04x", tt.name, tt.in, got, tt.want)
		}
	}
	for _, bits := range []uint32{0x7fc00000, 0x7f800001, 0xffc00000, 0x7f802000} {
		nan := math.Float32frombits(bits)
		if h := half.Float16(nan); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
			t.Errorf("Float16(NaN %#08x) = %#04x, not a NaN", bits, h)
		}
	}
}

func TestBFloat16(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"one", 1, 0x3f80},
		{"minus two", -2, 0xc000},
		{"minus zero", float32(math.Copysign(0, -1)), 0x8000},
		{"tie to even stays", 1 + pow2(-8), 0x3f80},
		{"tie to even rounds up", 1 + 3*pow2(-8), 0x3f82},
		{"above tie", 1 + pow2(-8) + pow2(-20), 0x3f81},
		{"largest float32 overflows", math.MaxFloat32, 0x7f80},
		{"inf", float32(math.Inf(1)), 0x7f80},
		{"minus inf", float32(math.Inf(-1)), 0xff80},
		{"subnormal kept", math.Float32frombits(0x00010000), 0x0001},
		{"smallest subnormal tie to zero", math.Float32frombits(0x00008000), 0x0000},
	}
	for _, tt := range tests {
		if got := half.BFloat16(tt.in); got != tt.want {
			t.Errorf("%s: BFloat16(%g) = %#04x, want %#04x", tt.name, tt.in, got, tt.want)
		}
	}
	for _, bits := range []uint32{0x7fc00000, 0x7f800001, 0xff800001, 0x7f808000} {
		nan := math.Float32frombits(bits)
		if h := half.BFloat16(nan); h&0x7f80 != 0x7f80 || h&0x7f == 0 {
			t.Errorf("BFloat16(NaN %#08x) = %#04x, not a NaN", bits, h)
		}
	}
}

// TestRoundTrip checks every 16-bit pattern: widening is exact, so
// narrowing it again must give the same bits (NaNs: a NaN).
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for h := 0; h <= 0xffff; h++ {
		u := uint16(h)
		f := half.Float16ToFloat32(u)
		if u&0x7c00 == 0x7c00 && u&0x3ff != 0 {
			if !math.IsNaN(float64(f)) {
				t.Fatalf("float16 NaN %#04x widened to %g", u, f)
			}
		} else if got := half.Float16(f); got != u {
			t.Fatalf("float16 %#04x -> %g -> %#04x", u, f, got)
		}
		b := half.BFloat16ToFloat32(u)
		if u&0x7f80 == 0x7f80 && u&0x7f != 0 {
			if !math.IsNaN(float64(b)) {
				t.Fatalf("bfloat16 NaN %#04x widened to %g", u, b)
			}
		} else if got := half.BFloat16(b); got != u {
			t.Fatalf("bfloat16 %#04x -> %g -> %#04x", u, b, got)
		}
	}
	// Spot values the table above relies on.
	if got := half.Float16ToFloat32(0x0001); got != pow2(-24) {
		t.Fatalf("smallest float16 subnormal widened to %g", got)
	}
	if got := half.Float16ToFloat32(0xfbff); got != -65504 {
		t.Fatalf("float16 0xfbff widened to %g", got)
	}
}

func TestEncodeDecode(t *testing.T) {
	t.Parallel()
	src := []float32{1, -0.5, 3.140625, 65504}
	for _, dt := range []abi.DType{abi.DTypeFloat16, abi.DTypeBFloat16} {
		b := make([]byte, 2*len(src))
		if err := half.Encode(dt, b, src); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, len(src))
		if err := half.Decode(dt, got, b); err != nil {
			t.Fatal(err)
		}
		for i := range src {
			if rel := math.Abs(float64(got[i]-src[i])) / math.Abs(float64(src[i])); rel > 1.0/256 {
				t.Errorf("%v: %g came back as %g", dt, src[i], got[i])
			}
		}
	}
	if half.Encode(abi.DTypeFloat32, make([]byte, 2), []float32{1}) == nil {
		t.Error("Encode accepted float32")
	}
	if half.Decode(abi.DTypeFloat16, make([]float32, 2), make([]byte, 3)) == nil {
		t.Error("Decode accepted 3 bytes for 2 values")
	}
	if half.Encode(abi.DTypeBFloat16, make([]byte, 3), []float32{1, 2}) == nil {
		t.Error("Encode accepted 3 bytes for 2 values")
	}
}

// FuzzNearest checks that narrowing picks the nearest 16-bit value,
// ties to even, for any float32.
func FuzzNearest(f *testing.F) {
	for _, v := range []uint32{0x3f800000, 0x33000000, 0x477ff000, 0x387fc000, 0x7f7fffff, 0x00000001} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, bits uint32) {
		x := math.Float32frombits(bits)
		if math.IsNaN(float64(x)) {
			return
		}
		check := func(name string, h uint16, widen func(uint16) float32) {
			got := float64(widen(h))
			err := math.Abs(got - float64(x))
			if math.IsInf(got, 0) && !math.IsInf(float64(x), 0) {
				return // overflow: checked by the table
			}
			for _, n := range []uint16{h - 1, h + 1} {
				nv := float64(widen(n))
				if math.IsNaN(nv) || math.IsInf(nv, 0) || (n^h)&0x8000 != 0 {
					continue
				}
				nerr := math.Abs(nv - float64(x))
				if nerr < err || nerr == err && n&1 == 0 {
					t.Fatalf("%s(%g) = %#04x (%g), but %#04x (%g) is nearer or the even tie", name, x, h, got, n, nv)
				}
			}
		}
		check("Float16", half.Float16(x), half.Float16ToFloat32)
		check("BFloat16", half.BFloat16(x), half.BFloat16ToFloat32)
	})
}
