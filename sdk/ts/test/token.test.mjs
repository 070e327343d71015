// A tenant trains its own expert through the client against a live
// `moehost serve --tenants`: with its token (given, or from
// $MOEHOST_TOKEN) Backward changes the expert; without one it is
// Unauthenticated, names the way in, and changes nothing.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { Code, ConnectError, TOKEN_ENV, createMoehostClient, float32Tensor, toFloat32Array } from "../dist/index.js";
import { startServer } from "./serve.mjs";

const FFN_C = fileURLToPath(new URL("../../../examples/wasm-experts/ffn-c/ffn-c.wasm", import.meta.url));
const UID = "alice.ffn.0";
const HIDDEN = 8;
let server, dir, alice;

// moehost runs the moehost CLI and returns its stdout's last line.
function moehost(...args) {
  const out = execFileSync(process.env.MOEHOST_BIN, args, { encoding: "utf8", env: { ...process.env, [TOKEN_ENV]: "" } });
  return out.trim().split("\n").at(-1);
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "moehost-ts-tenants-"));
  const file = join(dir, "tenants.json");
  alice = moehost("tenant", "add", "alice", "--prefix", "alice", "--tenants", file);
  server = await startServer(["--tenants", file, "--no-dht", "--experts", "ffn.0", "--module", "ffn-c", "--hidden-dim", String(HIDDEN)]);
  const digest = moehost("upload", "--server", server.baseUrl, "--token", alice, FFN_C);
  moehost("deploy", "--server", server.baseUrl, "--token", alice, "--module", digest, "--experts", UID, "--config", `hidden_dim=${HIDDEN}`);
});
after(async () => {
  await server?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const x = float32Tensor([1, -2, 3, -4, 5, -6, 7, -8], [1, HIDDEN]);
const dy = float32Tensor(new Float32Array(HIDDEN).fill(1), [1, HIDDEN]);

async function forward() {
  const [y] = await createMoehostClient({ baseUrl: server.baseUrl, token: alice }).expert(UID).forward(x);
  return [...toFloat32Array(y)];
}

// withEnv runs fn with $MOEHOST_TOKEN set to value (deleted for undefined).
async function withEnv(value, fn) {
  const old = process.env[TOKEN_ENV];
  if (value === undefined) delete process.env[TOKEN_ENV];
  else process.env[TOKEN_ENV] = value;
  try {
    return await fn();
  } finally {
    if (old === undefined) delete process.env[TOKEN_ENV];
    else process.env[TOKEN_ENV] = old;
  }
}

describe("a tenant trains its expert", () => {
  const cases = [
    { name: "with its token", env: undefined, opts: () => ({ token: alice }), train: true },
    { name: "with its token over gRPC-Web", env: undefined, opts: () => ({ token: alice, protocol: "grpc-web" }), train: true },
    { name: "with $MOEHOST_TOKEN", env: () => alice, opts: () => ({}), train: true },
    { name: "with no token", env: undefined, opts: () => ({}), train: false },
    { name: 'with token "" over $MOEHOST_TOKEN', env: () => alice, opts: () => ({ token: "" }), train: false },
  ];
  for (const tc of cases) {
    test(tc.name, async () => {
      const beforeY = await forward();
      const err = await withEnv(tc.env?.(), async () => {
        try {
          const [gx] = await createMoehostClient({ baseUrl: server.baseUrl, ...tc.opts() }).expert(UID).backward([x], [dy]);
          assert.equal(toFloat32Array(gx).length, HIDDEN);
          return undefined;
        } catch (e) {
          return e;
        }
      });
      const afterY = await forward();
      if (tc.train) {
        assert.equal(err, undefined, String(err));
        assert.notDeepEqual(afterY, beforeY, "backward did not change the expert");
        return;
      }
      assert.ok(err instanceof ConnectError, String(err));
      assert.equal(err.code, Code.Unauthenticated);
      assert.match(err.rawMessage, /needs a token .*: its owner's/);
      assert.deepEqual(afterY, beforeY, "a refused backward changed the expert");
    });
  }
});
