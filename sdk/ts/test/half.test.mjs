// Half-size tensors on the wire: the wireDType option against a live
// `moehost serve` (whose optimizer is off, so that Backward leaves the
// parameters as they are and every dtype sees the same expert), and the
// conversions against known bit patterns.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  DType,
  bfloat16Bits,
  bfloat16Value,
  createMoehostClient,
  float16Bits,
  float16Value,
  float32Tensor,
  shapeOf,
  toFloat32Array,
} from "../dist/index.js";
import { startServer } from "./serve.mjs";

const HIDDEN = 64;
const ROWS = 16;
let server;

before(async () => {
  server = await startServer([
    "--module", "ffn", "--hidden-dim", String(HIDDEN), "--experts", "ffn.0", "--optimizer", "none", "--no-dht",
  ]);
});
after(async () => {
  await server?.stop();
});

// A fixed pseudo-random input in [-2, 2), the same for every dtype.
function values(n, seed) {
  const v = new Float32Array(n);
  let s = seed;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    v[i] = (s / 2 ** 32) * 4 - 2;
  }
  return v;
}

// call runs a Forward and a Backward with the given wire dtype and
// returns the float32 results and the request and response body bytes.
async function call(protocol, wireDType) {
  const bytes = { sent: 0, got: 0 };
  const fetch = async (input, init) => {
    bytes.sent += init.body.byteLength;
    const res = await globalThis.fetch(input, init);
    const body = new Uint8Array(await res.arrayBuffer());
    bytes.got += body.byteLength;
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  const ffn = createMoehostClient({ baseUrl: server.baseUrl, protocol, wireDType, fetch }).expert("ffn.0");
  const shape = [ROWS, HIDDEN];
  const x = float32Tensor(values(ROWS * HIDDEN, 1), shape);
  const g = float32Tensor(values(ROWS * HIDDEN, 2), shape);
  const [y] = await ffn.forward(x);
  const [gx] = await ffn.backward([x], [g]);
  for (const t of [y, gx]) {
    assert.equal(t.dtype, DType.DTYPE_FLOAT32, "results come back as float32");
    assert.deepEqual(shapeOf(t), shape);
  }
  return { out: toFloat32Array(y), grad: toFloat32Array(gx), ...bytes };
}

for (const protocol of ["connect", "grpc-web"]) {
  describe(`wireDType over ${protocol}`, () => {
    let base;
    before(async () => {
      base = await call(protocol, DType.DTYPE_FLOAT32);
    });
    for (const { dt, eps } of [
      { dt: DType.DTYPE_FLOAT16, eps: 2 ** -11 }, // unit roundoff of the format
      { dt: DType.DTYPE_BFLOAT16, eps: 2 ** -8 },
    ]) {
      test(`${DType[dt]} is within its rounding of float32 and halves the bytes`, async (t) => {
        const got = await call(protocol, dt);
        // Rounding the input and then the result each move a value by at
        // most eps of itself; the layer norm and two linear layers add a
        // few eps more (as host/half_test.go reasons). A byte swapped or a
        // dtype misread would be off by far more.
        for (const [name, a, want] of [
          ["output", got.out, base.out],
          ["grad input", got.grad, base.grad],
        ]) {
          let scale = 0;
          for (const v of want) scale = Math.max(scale, Math.abs(v));
          let worst = 0;
          for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(a[i] - want[i]));
          t.diagnostic(`${name}: max error ${worst.toPrecision(3)} = ${(worst / (eps * scale)).toFixed(2)} eps of the scale ${scale.toPrecision(3)}`);
          assert.ok(worst <= 4 * eps * scale, `${name}: max error ${worst} > 4 eps of the scale ${scale}`);
          assert.ok(worst > 0, `${name}: identical to float32, so nothing went as ${DType[dt]}`);
        }
        // Bodies are the tensors plus a little framing and the uid.
        t.diagnostic(`request bytes ${got.sent} vs ${base.sent} float32, response bytes ${got.got} vs ${base.got}`);
        const sent = got.sent / base.sent;
        const recv = got.got / base.got;
        assert.ok(sent > 0.49 && sent < 0.51, `request bytes ${got.sent} are ${sent} of float32's ${base.sent}`);
        assert.ok(recv > 0.49 && recv < 0.51, `response bytes ${got.got} are ${recv} of float32's ${base.got}`);
      });
    }
  });
}

describe("half conversions", () => {
  test("float16: known values, rounding to nearest even, overflow, subnormals, NaN", () => {
    for (const [x, bits] of [
      [1, 0x3c00],
      [-2, 0xc000],
      [65504, 0x7bff], // largest finite
      [65520, 0x7c00], // halfway to the next, rounds to even: infinity
      [1 + 2 ** -11, 0x3c00], // halfway between 1 and the next: ties to even
      [1 + 3 * 2 ** -11, 0x3c02], // halfway, odd below: up
      [2 ** -24, 0x0001], // smallest subnormal
      [2 ** -25, 0x0000], // half of it: ties to even, zero
      [-0, 0x8000],
      [Infinity, 0x7c00],
    ]) {
      assert.equal(float16Bits(x), bits, `float16Bits(${x})`);
    }
    assert.ok(Number.isNaN(float16Value(float16Bits(NaN))));
    for (let h = 0; h < 0x7c00; h += 7) assert.equal(float16Bits(float16Value(h)), h, `round trip of 0x${h.toString(16)}`);
  });
  test("bfloat16: known values, rounding to nearest even, NaN", () => {
    for (const [x, bits] of [
      [1, 0x3f80],
      [-2, 0xc000],
      [1 + 2 ** -8, 0x3f80], // halfway: ties to even
      [1 + 3 * 2 ** -8, 0x3f82],
      [3.4028234663852886e38, 0x7f80], // float32's largest rounds up to infinity
      [-Infinity, 0xff80],
    ]) {
      assert.equal(bfloat16Bits(x), bits, `bfloat16Bits(${x})`);
    }
    assert.ok(Number.isNaN(bfloat16Value(bfloat16Bits(NaN))));
    for (let h = 0; h < 0x7f80; h += 13) assert.equal(bfloat16Bits(bfloat16Value(h)), h, `round trip of 0x${h.toString(16)}`);
  });
  test("an unsupported wireDType throws", () => {
    assert.throws(() => createMoehostClient({ baseUrl: "http://127.0.0.1:1", wireDType: DType.DTYPE_INT32 }), /want DTYPE_FLOAT32/);
  });
});
