// RemoteMixtureOfExperts against live `moehost serve` processes: a tenant
// grid is found by its prefix; a SIGKILLed server is banned after its
// first failure and its experts replaced; trustedPeers pins host keys.
import { test } from "node:test";
import assert from "node:assert/strict";
import { RemoteMixtureOfExperts, KMinNotMetError } from "../dist/index.js";
import { startServer } from "./serve.mjs";

const x = new Float32Array([1, 2, 3, 4]);

test("a tenant grid is found by its prefix", async () => {
  const s = await startServer(["--experts", "me.linear.[0:2]", "--hidden-dim", "4", "--no-checkpoints", "--update-period", "1s"]);
  try {
    const moe = new RemoteMixtureOfExperts({ baseUrl: s.baseUrl, uidPrefix: "me.linear.", kBest: 2, kMin: 2 });
    const { output, experts } = await moe.forward(x, [[0, 0]]);
    assert.equal(output.length, 4);
    assert.deepEqual([...experts].sort(), ["me.linear.0", "me.linear.1"]);
  } finally {
    await s.stop();
  }
});

test("a killed server is banned and its experts replaced; trustedPeers pins host keys", async () => {
  const a = await startServer(["--experts", "ffn.[0:2]", "--hidden-dim", "4", "--no-checkpoints", "--update-period", "10s"]);
  const b = await startServer(["--experts", "ffn.[2:4]", "--hidden-dim", "4", "--no-checkpoints", "--update-period", "10s", "--initial-peers", a.dhtAddrs[0]]);
  try {
    const moe = new RemoteMixtureOfExperts({ baseUrl: a.baseUrl, uidPrefix: "ffn", kBest: 2, kMin: 2, banBase: 30000 });
    const scores = [[0, 0, 5, 5]]; // b's experts first
    for (let i = 0; ; i++) {
      try {
        const { experts } = await moe.forward(x, scores);
        if (experts.includes("ffn.2")) break;
      } catch (err) {
        if (!(err instanceof KMinNotMetError)) throw err;
      }
      assert.ok(i < 30, "b's experts never became discoverable");
      await new Promise((r) => setTimeout(r, 1000));
    }
    b.kill("SIGKILL");
    let failed = 0;
    for (let i = 0; i < 5; i++) {
      try {
        await moe.forward(x, scores);
      } catch (err) {
        if (!(err instanceof KMinNotMetError)) throw err;
        failed++;
      }
    }
    assert.ok(failed <= 1, `the dead server was called again after it failed (${failed} of 5 failed)`);
    assert.ok(moe.banned(b.baseUrl));

    const pinned = new RemoteMixtureOfExperts({ baseUrl: a.baseUrl, uidPrefix: "ffn", kBest: 2, trustedPeers: [a.peerId] });
    const { experts } = await pinned.forward(x, scores);
    assert.deepEqual([...experts].sort(), ["ffn.0", "ffn.1"]);
  } finally {
    await a.stop();
    await b.stop();
  }
});
