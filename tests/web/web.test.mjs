// Browser tests: the dashboard at /ui/ in headless Chromium (Debian's,
// driven by playwright-core), and the TypeScript client calling the server
// from pages on other origins, allowed or not by --cors-origin.
//
// make test-web runs it with MOEHOST_BIN, CHROMIUM and WEB_TEST_OUT set;
// the screenshot goes to $WEB_TEST_OUT/dashboard.png.
import assert from "node:assert/strict";
import { readFile, mkdir } from "node:fs/promises";
import { createServer } from "node:http";
import { extname, join, normalize } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

import { startServer } from "../../sdk/ts/test/serve.mjs";

const HIDDEN = 64;
const OUT = process.env.WEB_TEST_OUT ?? fileURLToPath(new URL("out", import.meta.url));
const DIST = fileURLToPath(new URL("dist", import.meta.url));

let server;
let browser;
let allowed; // a static server whose origin --cors-origin lists
let refused; // one whose origin it does not

/** serveStatic serves DIST on a free loopback port. */
async function serveStatic() {
  const types = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css" };
  const srv = createServer(async (req, res) => {
    const path = normalize(new URL(req.url, "http://x").pathname).replace(/^(\.\.[/\\])+/, "");
    try {
      const body = await readFile(join(DIST, path));
      res.writeHead(200, { "Content-Type": types[extname(path)] ?? "application/octet-stream" });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return { srv, origin: `http://127.0.0.1:${srv.address().port}` };
}

before(async () => {
  allowed = await serveStatic();
  refused = await serveStatic();
  server = await startServer([
    "--module", "ffn", "--hidden-dim", String(HIDDEN), "--experts", "ffn.[0:3]",
    "--cors-origin", allowed.origin,
  ]);
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: [
      "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
});

after(async () => {
  await browser?.close();
  await server?.stop();
  allowed?.srv.close();
  refused?.srv.close();
});

/** forwardLoad sends Connect JSON Forward calls until stop() is called. */
function forwardLoad(baseUrl, workers = 4, rows = 16) {
  let running = true;
  let calls = 0;
  const data = Buffer.alloc(rows * HIDDEN * 4);
  for (let i = 0; i < rows * HIDDEN; i++) data.writeFloatLE(Math.sin(i), i * 4);
  const body = JSON.stringify({
    uid: "ffn.0",
    inputs: [{ dtype: "DTYPE_FLOAT32", shape: [String(rows), String(HIDDEN)], data: data.toString("base64") }],
  });
  const loops = Array.from({ length: workers }, async () => {
    while (running) {
      const res = await fetch(`${baseUrl}/moehost.v1.ExpertService/Forward`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body,
      });
      const text = await res.text();
      assert.equal(res.status, 200, text);
      calls++;
    }
  });
  return {
    async stop() {
      running = false;
      await Promise.all(loops);
      return calls;
    },
  };
}

test("the dashboard lists the experts, runs a Forward and charts the load", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(`${server.baseUrl}/ui/`);

  // The experts, with their schema and health.
  const rows = page.locator("#experts tbody tr");
  await rows.first().waitFor();
  assert.deepEqual(await rows.evaluateAll((trs) => trs.map((tr) => tr.dataset.uid)), ["ffn.0", "ffn.1", "ffn.2"]);
  const first = await rows.first().innerText();
  assert.match(first, new RegExp(`x:float32\\[-1,${HIDDEN}\\]`));
  assert.match(first, /healthy/);
  // Experts the server was started with belong to its operator.
  assert.equal(await rows.first().locator("td.owner").innerText(), "operator");
  await page.locator('#server-info dd[data-key="experts"]').filter({ hasText: "3" }).waitFor();
  assert.equal(await page.locator("#conn-text").innerText(), "live");

  // The token field is kept in session storage.
  await page.fill("#token", "t0k3n");
  await page.locator("#token").dispatchEvent("change");
  assert.equal(await page.evaluate(() => sessionStorage.getItem("moehost.token")), "t0k3n");
  await page.reload();
  assert.equal(await page.inputValue("#token"), "t0k3n");
  await page.fill("#token", "");
  await page.locator("#token").dispatchEvent("change");
  await rows.first().waitFor();

  // Forward from the form: 5 rows into ffn.1 give a [5, HIDDEN] output.
  await page.selectOption("#forward-uid", "ffn.1");
  await page.fill("#forward-rows", "5");
  await page.click("#forward-run");
  await page.locator("#forward-shape").filter({ hasText: `[5, ${HIDDEN}]` }).waitFor({ timeout: 30_000 });
  assert.equal(await page.locator("#forward-input-shape").innerText(), `[5, ${HIDDEN}]`);
  assert.match(await page.locator("#forward-mean").innerText(), /^-?\d+\.\d{4} ± \d+\.\d{4}$/);
  assert.equal(await page.locator("#forward-hist rect").count(), 40);
  assert.ok(await page.locator("#forward-error").isHidden());

  // Under load, the throughput chart rises from what it showed before.
  const chart = page.locator("#chart-throughput");
  const idle = Number(await chart.getAttribute("data-last"));
  const points = Number(await chart.getAttribute("data-points"));
  const load = forwardLoad(server.baseUrl);
  try {
    await page.waitForFunction(
      (idle) => Number(document.querySelector("#chart-throughput").dataset.last) > idle + 50,
      idle,
      { timeout: 60_000, polling: 250 },
    );
    // A few more seconds of load, for the screenshot.
    await page.waitForFunction(
      (n) => Number(document.querySelector("#chart-throughput").dataset.points) >= n,
      Math.min(points + 8, 60),
      { timeout: 30_000, polling: 250 },
    );
    await mkdir(OUT, { recursive: true });
    await page.screenshot({ path: join(OUT, "dashboard.png"), fullPage: true });
  } finally {
    const calls = await load.stop();
    assert.ok(calls > 0, "the load sent no calls");
  }
  assert.ok(Number(await chart.getAttribute("data-points")) > points, "the chart gained no points");
  assert.match(await chart.locator("path.line").getAttribute("d"), /^M[\d.]+,[\d.]+(L[\d.]+,[\d.]+)+$/);
  // The rows/s column of the loaded expert.
  const rate = await page.locator("#experts tbody tr[data-uid='ffn.0'] td:nth-child(7)").innerText();
  assert.ok(Number.parseFloat(rate) > 0, `ffn.0 shows ${rate} rows/s`);

  assert.deepEqual(errors, []);
  await page.close();
});

test("the charts draw the server's history at once on load", async () => {
  // Load for a few seconds before the page is opened: the server samples
  // it every second whether or not a page watches.
  const load = forwardLoad(server.baseUrl, 2);
  await new Promise((r) => setTimeout(r, 4000));
  await load.stop();
  const history = await (await fetch(`${server.baseUrl}/ui/api/history`)).json();
  assert.equal(history.interval_ms, 1000);
  assert.ok(history.unix_ms.length >= 4, `the server holds ${history.unix_ms.length} samples`);
  assert.ok(Math.max(...history.rows_per_second) > 0, "the history shows no load");

  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  try {
    await page.goto(`${server.baseUrl}/ui/`);
    // The first drawing of each chart already holds the history: at least
    // the samples fetched above, and the rates under the load, where one
    // poll of the page's own would draw one point.
    const chart = page.locator("#chart-throughput[data-points]");
    await chart.waitFor({ timeout: 10_000 });
    const points = Number(await chart.getAttribute("data-points"));
    assert.ok(points >= history.unix_ms.length, `the chart drew ${points} points at load, the server held ${history.unix_ms.length}`);
    assert.ok(Number(await chart.getAttribute("data-max")) > 0, "the chart shows no rate at load");
    for (const id of ["#chart-batch", "#chart-queue", "#chart-latency"]) {
      assert.ok(Number(await page.locator(id).getAttribute("data-points")) >= history.unix_ms.length, id);
    }
    assert.match(await page.locator("#chart-throughput path.line").getAttribute("d"), /^M[\d.]+,[\d.]+(L[\d.]+,[\d.]+)+$/);

    assert.deepEqual(errors, []);
  } finally {
    await page.close();
  }
});

test("counts read as counts: parameters in human units, steps singular or plural", async () => {
  // ffn at hidden_dim 2 has 46 parameters (once shown as "46.0").
  const tiny = await startServer(["--module", "ffn", "--hidden-dim", "2", "--experts", "tiny.0", "--no-dht", "--no-checkpoints"]);
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  try {
    await page.goto(`${tiny.baseUrl}/ui/`);
    const row = page.locator("#experts tbody tr[data-uid='tiny.0']");
    await row.waitFor({ timeout: 10_000 });
    const params = row.locator("td:nth-child(6)");
    assert.equal(await params.innerText(), "46");
    assert.equal(await params.getAttribute("title"), "46 parameters");
    assert.equal(await row.locator("td:nth-child(11)").innerText(), "0 steps");
    const x = { dtype: "DTYPE_FLOAT32", shape: ["1", "2"], data: Buffer.alloc(8).toString("base64") };
    const res = await fetch(`${tiny.baseUrl}/moehost.v1.ExpertService/Backward`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ uid: "tiny.0", inputs: [x], gradOutputs: [x] }),
    });
    assert.equal(res.status, 200, await res.text());
    await row.locator("td:nth-child(11)").filter({ hasText: /^1 step$/ }).waitFor({ timeout: 10_000 });
    assert.deepEqual(errors, []);
  } finally {
    await page.close();
    await tiny.stop();
  }
});

test("the DHT panel shows the node's peer id, multiaddrs, URLs, records and peers, and the swarm its hosts and experts", async () => {
  assert.match(server.peerId, /^12D3KooW/, "the server logged no DHT peer id");
  // A second server joins the first's swarm, so that the panel has a peer.
  const peer = await startServer([
    "--module", "ffn", "--hidden-dim", String(HIDDEN), "--experts", "ffn.9", "--no-checkpoints",
    "--initial-peers", server.dhtAddrs.join(","),
  ]);
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  try {
    await page.goto(`${server.baseUrl}/ui/`);
    const id = page.locator("#dht-peer-id");
    await id.filter({ hasText: server.peerId }).waitFor({ timeout: 30_000 });
    assert.equal(await id.innerText(), server.peerId);
    assert.ok(await page.locator("#dht-off").isHidden());
    const texts = (sel) => page.locator(`${sel} li`).allInnerTexts();
    assert.deepEqual(await texts("#dht-addrs"), server.dhtAddrs);
    assert.deepEqual(await texts("#dht-announce"), [server.baseUrl]);
    // The records: every uid and the grid prefix.
    assert.deepEqual((await texts("#dht-records")).sort(), ["ffn.", "ffn.0", "ffn.1", "ffn.2"]);
    // The peer shows once the server's info is fetched again (every 5 s),
    // with the multiaddrs it listens on.
    const row = page.locator(`#dht-peers tbody tr[data-peer="${peer.peerId}"]`);
    await row.waitFor({ timeout: 30_000 });
    assert.match(await row.innerText(), new RegExp(`^${peer.peerId}\\s`));
    const listen = peer.dhtAddrs[0].replace(`/p2p/${peer.peerId}`, "");
    await row.locator("td.addrs").filter({ hasText: listen }).waitFor({ timeout: 30_000 });
    assert.equal(await page.locator("#dht-peer-count").innerText(), "1 known");

    // The swarm view: both hosts and the experts each announces, with
    // their liveness.
    const hostRow = (id) => page.locator(`#swarm-hosts tbody tr[data-peer="${id}"]`);
    await hostRow(peer.peerId).waitFor({ timeout: 30_000 });
    assert.match(await hostRow(server.peerId).innerText(), /this server/);
    assert.match(await hostRow(peer.peerId).innerText(), new RegExp(`${peer.baseUrl}\\s+1\\s+\\d+s`));
    const swarmUids = await page.locator("#swarm-experts tbody tr").evaluateAll((trs) => trs.map((tr) => `${tr.dataset.uid}@${tr.dataset.peer}`));
    assert.deepEqual(swarmUids, [
      `ffn.0@${server.peerId}`, `ffn.1@${server.peerId}`, `ffn.2@${server.peerId}`, `ffn.9@${peer.peerId}`,
    ]);
    const nine = await page.locator('#swarm-experts tbody tr[data-uid="ffn.9"] td:last-child').innerText();
    assert.match(nine, /^\d+s$|^\dm \d+s$/, `ffn.9 expires in ${nine}`);
    assert.equal(await page.locator("#swarm-summary").innerText(), "2 hosts, 4 experts");
    await mkdir(OUT, { recursive: true });
    await page.locator("#dht").screenshot({ path: join(OUT, "dht.png") });
    assert.deepEqual(errors, []);
  } finally {
    await page.close();
    await peer.stop();
  }
});

test("the DHT panel says so when the server has no DHT node", async () => {
  const solo = await startServer(["--module", "ffn", "--hidden-dim", String(HIDDEN), "--experts", "ffn.0", "--no-dht"]);
  const page = await browser.newPage();
  try {
    assert.equal(solo.peerId, "");
    await page.goto(`${solo.baseUrl}/ui/`);
    await page.locator("#dht-off").waitFor({ timeout: 30_000 });
    assert.ok(await page.locator("#dht-on").isHidden());
    assert.equal(await page.locator("#dht-summary").innerText(), "off");
    await page.locator("#swarm-off").waitFor({ timeout: 10_000 });
    assert.ok(await page.locator("#swarm-on").isHidden());
  } finally {
    await page.close();
    await solo.stop();
  }
});

test("the TypeScript client works from another origin only where --cors-origin allows it", async () => {
  const cases = [
    { name: "allowed, Connect", origin: allowed.origin, protocol: "connect", ok: true },
    { name: "allowed, gRPC-Web", origin: allowed.origin, protocol: "grpc-web", ok: true },
    { name: "allowed, with a token", origin: allowed.origin, protocol: "connect", token: "abc", ok: true },
    { name: "refused, Connect", origin: refused.origin, protocol: "connect", ok: false },
    { name: "refused, gRPC-Web", origin: refused.origin, protocol: "grpc-web", ok: false },
  ];
  const page = await browser.newPage();
  for (const c of cases) {
    await page.goto(`${c.origin}/crossorigin.html`);
    await page.locator("body[data-ready=true]").waitFor();
    const res = await page.evaluate(([base, p, t]) => window.callServer(base, p, t), [server.baseUrl, c.protocol, c.token]);
    if (c.ok) {
      assert.deepEqual(res, { ok: true, expertCount: 3, shape: [2, HIDDEN] }, c.name);
    } else {
      assert.equal(res.ok, false, `${c.name}: the call succeeded`);
      // The browser hides why; fetch fails before any response is read.
      assert.match(res.error, /Failed to fetch|NetworkError/, c.name);
    }
  }
  await page.close();
});
