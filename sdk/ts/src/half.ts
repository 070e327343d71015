// Conversions between float32 and the two 16-bit float formats moehost
// carries on the wire (IEEE 754 binary16 and bfloat16), as the Go
// package abi/half does them: to 16 bits rounds to nearest, ties to even,
// with overflow to infinity and NaNs kept quiet NaNs; back to float32 is
// exact.
import { DType } from "./gen/moehost/v1/tensor_pb.js";

// One scratch word reinterprets a float32 as its bits and back.
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function bitsOf(x: number): number {
  f32[0] = x;
  return u32[0];
}

function fromBits(b: number): number {
  u32[0] = b >>> 0;
  return f32[0];
}

/** float16Bits returns the float16 nearest to the float32 value of x, ties to even. */
export function float16Bits(x: number): number {
  const b = bitsOf(x);
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  const mant = b & 0x7fffff;
  if (exp === 0xff) {
    // Infinity, or a NaN with the quiet bit set so that it stays a NaN.
    return mant === 0 ? sign | 0x7c00 : sign | 0x7e00 | (mant >>> 13);
  }
  const e = exp - 127 + 15; // float16's biased exponent
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // A subnormal k·2⁻²⁴: the 24-bit significand shifted right, rounded.
    const shift = 14 - e;
    if (shift > 24) return sign;
    const m = mant | 0x800000;
    let k = m >>> shift;
    const rem = m & ((1 << shift) - 1);
    const halfway = 1 << (shift - 1);
    if (rem > halfway || (rem === halfway && (k & 1) === 1)) k++;
    return sign | k;
  }
  let h = sign | (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1) === 1)) h++; // may carry up to infinity, rightly
  return h;
}

/** float16Value returns the number equal to the float16 bits h. */
export function float16Value(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant === 0 ? sign * Infinity : NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** bfloat16Bits returns the bfloat16 nearest to the float32 value of x, ties to even. */
export function bfloat16Bits(x: number): number {
  const b = bitsOf(x);
  if ((b & 0x7fffffff) >>> 0 > 0x7f800000) return (b >>> 16) | 0x40; // a quiet NaN
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/** bfloat16Value returns the number equal to the bfloat16 bits h. */
export function bfloat16Value(h: number): number {
  return fromBits(h << 16);
}

/** isHalf reports whether dt is one of the two 16-bit float formats. */
export function isHalf(dt: DType): boolean {
  return dt === DType.DTYPE_FLOAT16 || dt === DType.DTYPE_BFLOAT16;
}

/** encodeHalf returns float32 values as little-endian 16-bit floats of type dt. */
export function encodeHalf(dt: DType, values: Float32Array): Uint8Array {
  const enc = dt === DType.DTYPE_FLOAT16 ? float16Bits : dt === DType.DTYPE_BFLOAT16 ? bfloat16Bits : undefined;
  if (!enc) throw new TypeError(`dtype ${DType[dt]} is not a 16-bit float`);
  const out = new Uint8Array(2 * values.length);
  const view = new DataView(out.buffer);
  for (let i = 0; i < values.length; i++) view.setUint16(2 * i, enc(values[i]), true);
  return out;
}

/** decodeHalf returns little-endian 16-bit floats of type dt as float32 values. */
export function decodeHalf(dt: DType, data: Uint8Array): Float32Array {
  const dec = dt === DType.DTYPE_FLOAT16 ? float16Value : dt === DType.DTYPE_BFLOAT16 ? bfloat16Value : undefined;
  if (!dec) throw new TypeError(`dtype ${DType[dt]} is not a 16-bit float`);
  if (data.length % 2 !== 0) throw new RangeError(`${DType[dt]} tensor has ${data.length} bytes, not a multiple of 2`);
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const out = new Float32Array(data.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = dec(view.getUint16(2 * i, true));
  return out;
}
