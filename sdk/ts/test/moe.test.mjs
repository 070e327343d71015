// RemoteMixtureOfExperts against live `moehost serve` processes: a tenant
// grid is found by its prefix; a SIGKILLed server is banned after its
// first failure and its experts replaced; trustedPeers pins host keys and
// finds the trusted experts however many others score higher.
import { test } from "node:test";
import assert from "node:assert/strict";
import { RemoteMixtureOfExperts, KMinNotMetError, MAX_TRUSTED_PEERS } from "../dist/index.js";
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

test("trustedPeers finds the trusted experts below a crowd of better ones", async () => {
  // The crowd's eight experts outscore the trusted server's two: with kBest 2
  // that is four times over, as many as asking for 4 × k and filtering
  // afterwards could ever skip.
  const crowd = await startServer(["--experts", "ffn.[0:8]", "--hidden-dim", "4", "--no-checkpoints", "--update-period", "10s"]);
  const trusted = await startServer(["--experts", "ffn.[8:10]", "--hidden-dim", "4", "--no-checkpoints", "--update-period", "10s", "--initial-peers", crowd.dhtAddrs[0]]);
  try {
    const moe = new RemoteMixtureOfExperts({ baseUrl: crowd.baseUrl, uidPrefix: "ffn", kBest: 2, kMin: 2, trustedPeers: [trusted.peerId] });
    const scores = [[10, 9, 8, 7, 6, 5, 4, 3, 1, 0]];
    let experts;
    for (let i = 0; ; i++) {
      try {
        ({ experts } = await moe.forward(x, scores));
        break;
      } catch (err) {
        // The trusted server's records have not reached the crowd's node yet.
        if (!(err instanceof KMinNotMetError)) throw err;
      }
      assert.ok(i < 300, "the trusted experts were never found");
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.deepEqual(experts, ["ffn.8", "ffn.9"]);
    assert.ok(!moe.banned(crowd.baseUrl) && !moe.banned(trusted.baseUrl));
    assert.throws(() => new RemoteMixtureOfExperts({ baseUrl: crowd.baseUrl, uidPrefix: "ffn", kBest: 1, trustedPeers: Array(MAX_TRUSTED_PEERS + 1).fill(trusted.peerId) }), RangeError);
  } finally {
    await crowd.stop();
    await trusted.stop();
  }
});
