// The client against `moehost serve --tls-cert` with a CA made for the
// test: Node trusts a private CA through NODE_EXTRA_CA_CERTS, which it
// reads once, at start, so each case runs the client in a child node
// with or without it. Over Connect and gRPC-Web the https:// base URL
// works with the CA; without it fetch refuses the certificate.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { after, before, test } from "node:test";

import { makeCA, startServer } from "./serve.mjs";

const DIST = new URL("../dist/index.js", import.meta.url).href;
let ca, server;

before(async () => {
  ca = makeCA();
  server = await startServer(["--tls-cert", ca.cert, "--tls-key", ca.key, "--module", "nop", "--hidden-dim", "4", "--experts", "nop.0", "--no-dht"]);
});
after(async () => {
  await server?.stop();
  ca?.remove();
});

// A Forward of one row through nop (the identity), printed as JSON.
const script = `
import { createMoehostClient, float32Tensor, toFloat32Array } from ${JSON.stringify(DIST)};
const c = createMoehostClient({ baseUrl: process.env.BASE_URL, protocol: process.env.PROTOCOL });
try {
  const [y] = await c.expert("nop.0").forward(float32Tensor([1, -2, 3.5, 4], [1, 4]));
  console.log(JSON.stringify({ y: [...toFloat32Array(y)] }));
} catch (e) {
  console.log(JSON.stringify({ error: String(e), cause: String(e.cause?.cause ?? e.cause ?? "") }));
}
`;

/** run runs the script in a child node with env added, and parses its output. */
function run(env) {
  const childEnv = { ...process.env, BASE_URL: server.baseUrl, ...env };
  delete childEnv.NODE_EXTRA_CA_CERTS;
  if (env.NODE_EXTRA_CA_CERTS) childEnv.NODE_EXTRA_CA_CERTS = env.NODE_EXTRA_CA_CERTS;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ["--input-type=module", "-e", script], { env: childEnv }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${err}\n${stderr}`));
      else resolve(JSON.parse(stdout));
    });
  });
}

test("the server speaks TLS", () => {
  assert.match(server.baseUrl, /^https:\/\/127\.0\.0\.1:\d+$/);
});

for (const protocol of ["connect", "grpc-web"]) {
  test(`forward over https with NODE_EXTRA_CA_CERTS (${protocol})`, async () => {
    const out = await run({ NODE_EXTRA_CA_CERTS: ca.ca, PROTOCOL: protocol });
    assert.deepEqual(out, { y: [1, -2, 3.5, 4] });
  });
}

test("without the CA, the certificate is refused", async () => {
  const out = await run({ PROTOCOL: "connect" });
  assert.ok(out.error, JSON.stringify(out));
  assert.match(out.cause, /certificate|self[- ]signed|UNABLE_TO_VERIFY/i, JSON.stringify(out));
});
