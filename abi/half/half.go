// Package half converts between float32 and the two 16-bit float formats
// that moehost carries on the wire, IEEE 754 binary16 (float16) and
// bfloat16. Compute stays float32: the server and the clients convert at
// the edge, so a call moves half the bytes.
//
// Conversions to 16 bits round to nearest, ties to even; values too large
// become infinities, values too small become (signed) zeros or float16
// subnormals, and NaNs stay NaNs (quiet). Conversions to float32 are exact.
package half

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moehost/moehost/abi"
)

// Float16 returns the float16 nearest to f, ties to even.
func Float16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant == 0 {
			return sign | 0x7c00
		}
		// Keep the top of the payload and set the quiet bit, so that the
		// result is a NaN even when the kept bits are all zero.
		return sign | 0x7e00 | uint16(mant>>13)
	}
	e := exp - 127 + 15 // float16's biased exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// A float16 subnormal k·2⁻²⁴: k is the 24-bit significand shifted
		// right by 14-e, rounded. A shift past 24 leaves less than half of
		// the smallest subnormal, which rounds to zero.
		shift := 14 - e
		if shift > 24 {
			return sign
		}
		m := mant | 0x800000
		k := m >> shift
		rem := m & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || rem == halfway && k&1 == 1 {
			k++ // may carry into the smallest normal, which is right
		}
		return sign | uint16(k)
	}
	h := sign | uint16(e)<<10 | uint16(mant>>13)
	rem := mant & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent, up to infinity, which is right
	}
	return h
}

// Float16ToFloat32 returns the float32 equal to the float16 h.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		// Zero or subnormal: mant·2⁻²⁴, exact in float32.
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// BFloat16 returns the bfloat16 nearest to f, ties to even.
func BFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		// NaN: truncating could clear every payload bit and make an
		// infinity, so set the quiet bit.
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BFloat16ToFloat32 returns the float32 equal to the bfloat16 h.
func BFloat16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Is reports whether dt is one of the 16-bit float formats this package
// converts.
func Is(dt abi.DType) bool { return dt == abi.DTypeFloat16 || dt == abi.DTypeBFloat16 }

// Decode converts little-endian 16-bit floats of type dt in src to
// float32s in dst; len(src) must be 2·len(dst).
func Decode(dt abi.DType, dst []float32, src []byte) error {
	if len(src) != 2*len(dst) {
		return fmt.Errorf("half: decode: %d bytes for %d values", len(src), len(dst))
	}
	switch dt {
	case abi.DTypeFloat16:
		for i := range dst {
			dst[i] = Float16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case abi.DTypeBFloat16:
		for i := range dst {
			dst[i] = BFloat16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		return fmt.Errorf("half: decode: dtype %v is not a 16-bit float", dt)
	}
	return nil
}

// Encode converts float32s in src to little-endian 16-bit floats of type
// dt in dst; len(dst) must be 2·len(src).
func Encode(dt abi.DType, dst []byte, src []float32) error {
	if len(dst) != 2*len(src) {
		return fmt.Errorf("half: encode: %d bytes for %d values", len(dst), len(src))
	}
	switch dt {
	case abi.DTypeFloat16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], Float16(v))
		}
	case abi.DTypeBFloat16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], BFloat16(v))
		}
	default:
		return fmt.Errorf("half: encode: dtype %v is not a 16-bit float", dt)
	}
	return nil
}
