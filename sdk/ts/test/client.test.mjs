// The client against a live `moehost serve`, over Connect and gRPC-Web.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  Code,
  ConnectError,
  createMoehostClient,
  float32Tensor,
  randomInput,
  shapeOf,
  stats,
  toFloat32Array,
} from "../dist/index.js";
import { startServer } from "./serve.mjs";

const HIDDEN = 16;
let server;

before(async () => {
  server = await startServer(["--module", "ffn", "--hidden-dim", String(HIDDEN), "--experts", "ffn.[0:2]"]);
});
after(async () => {
  await server?.stop();
});

describe("server info", () => {
  test("describes the server", async () => {
    const info = await createMoehostClient({ baseUrl: server.baseUrl }).info();
    assert.equal(info.listenAddress, server.addr);
    assert.equal(info.expertCount, 2);
    assert.ok(info.version.length > 0, "version is empty");
    assert.match(info.goVersion, /^go1\./);
    assert.equal(info.devices[0]?.name, "cpu");
    assert.ok(info.uptimeSeconds >= 0 && info.uptimeSeconds < 600, `uptime ${info.uptimeSeconds}`);
    assert.ok(info.startTime, "no start time");
  });
});

for (const protocol of ["connect", "grpc-web"]) {
  describe(protocol, () => {
    const client = () => createMoehostClient({ baseUrl: server.baseUrl, protocol });

    test("lists the experts with their schema", async () => {
      const { experts } = await client().experts.listExperts({});
      assert.deepEqual(experts.map((e) => e.uid), ["ffn.0", "ffn.1"]);
      for (const e of experts) {
        assert.equal(e.inputs.length, 1);
        assert.deepEqual(e.inputs[0].shape, [-1n, BigInt(HIDDEN)]);
        assert.match(e.moduleDigest, /^sha256:[0-9a-f]{64}$/);
        assert.equal(e.healthy, true);
      }
    });

    test("forward returns the schema's shape, the same for the same input", async () => {
      const ffn = client().expert("ffn.0");
      const info = await ffn.info();
      const x = randomInput(info.inputs[0], 3);
      const [a] = await ffn.forward(x);
      const [b] = await ffn.forward(x);
      assert.deepEqual(shapeOf(a), [3, HIDDEN]);
      const va = toFloat32Array(a);
      assert.equal(va.length, 3 * HIDDEN);
      assert.deepEqual(va, toFloat32Array(b));
      const st = stats(va);
      assert.ok(Number.isFinite(st.mean) && st.std > 0, `output stats ${JSON.stringify(st)}`);
    });

    test("backward trains the expert", async () => {
      const c = client();
      const ffn = c.expert("ffn.1");
      const before = (await ffn.info()).stats?.backwardBatches ?? 0n;
      const x = randomInput((await ffn.info()).inputs[0], 2);
      const g = float32Tensor(new Float32Array(2 * HIDDEN).fill(0.5), [2, HIDDEN]);
      const [gx] = await ffn.backward([x], [g]);
      assert.deepEqual(shapeOf(gx), [2, HIDDEN]);
      assert.ok(toFloat32Array(gx).some((v) => v !== 0), "input gradient is all zero");
      const afterCount = (await ffn.info()).stats?.backwardBatches ?? 0n;
      assert.equal(afterCount, before + 1n);
    });

    test("an unknown uid is NotFound", async () => {
      await assert.rejects(client().expert("nope.0").info(), (err) => {
        assert.ok(err instanceof ConnectError, String(err));
        assert.equal(err.code, Code.NotFound);
        assert.match(err.rawMessage, /nope\.0/);
        return true;
      });
    });

    test("a wrong shape is InvalidArgument", async () => {
      const bad = float32Tensor(new Float32Array(3), [1, 3]);
      await assert.rejects(client().expert("ffn.0").forward(bad), (err) => {
        assert.ok(err instanceof ConnectError, String(err));
        assert.equal(err.code, Code.InvalidArgument);
        return true;
      });
    });
  });
}

describe("tensors", () => {
  test("float32Tensor and toFloat32Array round-trip little-endian bytes", () => {
    const t = float32Tensor([1, -2.5, 3e-8, 1e30], [2, 2]);
    assert.deepEqual(t.shape, [2n, 2n]);
    assert.deepEqual([...t.data.slice(0, 4)], [0x00, 0x00, 0x80, 0x3f]); // 1.0f
    assert.deepEqual(toFloat32Array(t), Float32Array.from([1, -2.5, 3e-8, 1e30]));
  });
  test("float32Tensor refuses a shape that does not hold the values", () => {
    assert.throws(() => float32Tensor([1, 2, 3], [2, 2]), /holds 4 values, got 3/);
  });
  test("the token is sent as a bearer Authorization header", async () => {
    let seen;
    const fetch = async (input, init) => {
      seen = new Headers(init?.headers).get("authorization");
      throw new Error("stop here");
    };
    const c = createMoehostClient({ baseUrl: "http://127.0.0.1:1", token: "s3cret", fetch });
    await assert.rejects(c.info());
    assert.equal(seen, "Bearer s3cret");
  });
});
