// Browser tests: the dashboard at /ui/ in headless Chromium (Debian's,
// driven by playwright-core), and the TypeScript client calling the server
// from pages on other origins, allowed or not by --cors-origin.
//
// make test-web runs it with MOEHOST_BIN, CHROMIUM and WEB_TEST_OUT set;
// the screenshot goes to $WEB_TEST_OUT/dashboard.png.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { readFile, mkdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { createServer } from "node:http";
import { extname, join, normalize } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

import { makeCA, startServer } from "../../sdk/ts/test/serve.mjs";

const HIDDEN = 64;
const CHROMIUM_ARGS = [
  "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];
const OUT = process.env.WEB_TEST_OUT ?? fileURLToPath(new URL("out", import.meta.url));
const DIST = fileURLToPath(new URL("dist", import.meta.url));
const FFN_C = fileURLToPath(new URL("../../examples/wasm-experts/ffn-c/ffn-c.wasm", import.meta.url));

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
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", args: CHROMIUM_ARGS });
});

after(async () => {
  await browser?.close();
  await server?.stop();
  allowed?.srv.close();
  refused?.srv.close();
});

/** forwardLoad sends Connect JSON Forward calls to uid until stop() is called. */
function forwardLoad(baseUrl, workers = 4, rows = 16, uid = "ffn.0") {
  let running = true;
  let calls = 0;
  const data = Buffer.alloc(rows * HIDDEN * 4);
  for (let i = 0; i < rows * HIDDEN; i++) data.writeFloatLE(Math.sin(i), i * 4);
  const body = JSON.stringify({
    uid,
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

  // The experts, with their schema and health, come first on the page.
  const rows = page.locator("#experts tbody tr");
  await rows.first().waitFor();
  assert.deepEqual(await page.locator("main > section:not([hidden])").evaluateAll((ss) => ss.map((s) => s.id).slice(0, 3)), ["experts", "server", "load"]);
  const top = async (sel) => (await page.locator(sel).boundingBox()).y;
  assert.ok((await top("#experts")) < (await top("#load")), "the experts table is below the charts");
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
    // At least the samples fetched above that fall in its window.
    const from = Number(await chart.getAttribute("data-from-ms"));
    const held = history.unix_ms.filter((t) => t >= from).length;
    assert.ok(held >= 4, `${held} samples in the chart's window`);
    const points = Number(await chart.getAttribute("data-points"));
    assert.ok(points >= held, `the chart drew ${points} points at load, the server held ${held} in its window`);
    assert.ok(Number(await chart.getAttribute("data-max")) > 0, "the chart shows no rate at load");
    for (const id of ["#chart-batch", "#chart-queue", "#chart-latency"]) {
      assert.ok(Number(await page.locator(id).getAttribute("data-points")) >= held, id);
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

/** firstX is the x of a chart's first point, from its line's path. */
async function firstX(page, id) {
  const d = await page.locator(`${id} path.line`).getAttribute("d");
  const m = /^M([\d.]+),/.exec(d);
  assert.ok(m, `${id}: no line drawn (d=${d})`);
  return Number(m[1]);
}

test("the charts' window buttons set their time range, and the axis is labelled with time", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  try {
    await page.goto(`${server.baseUrl}/ui/`);
    const chart = page.locator("#chart-throughput");
    await page.waitForFunction(() => Number(document.querySelector("#chart-throughput").dataset.points) >= 2, null, { timeout: 30_000 });
    const attr = async (name, id = "#chart-throughput") => Number(await page.locator(id).getAttribute(`data-${name}`));
    const labels = () => chart.locator(".ticks span").allInnerTexts();
    const pressed = () => page.locator('#load .windows button[aria-pressed="true"]').allInnerTexts();

    // 5 minutes at first, labelled from "-5m" to "now".
    assert.deepEqual(await pressed(), ["5 min"]);
    assert.equal(await attr("window-ms"), 300_000);
    assert.deepEqual(await labels(), ["now", "-1m", "-2m", "-3m", "-4m", "-5m"]);
    // Each tick is titled with its clock time; "now" is the newest sample's.
    const now = chart.locator(".ticks span", { hasText: "now" });
    assert.equal(Number(await now.getAttribute("data-t")), await attr("to-ms"));
    for (const t of await chart.locator(".ticks span").evaluateAll((ss) => ss.map((s) => s.title))) {
      assert.match(t, /^\d\d:\d\d:\d\d$/);
    }
    const x5 = await firstX(page, "#chart-throughput");

    // 1 minute: every chart spans 60 s, ticks every 15 s, and the same
    // oldest point lies further left (or off the chart).
    await page.getByRole("button", { name: "1 min" }).click();
    assert.deepEqual(await pressed(), ["1 min"]);
    for (const id of ["#chart-throughput", "#chart-batch", "#chart-queue", "#chart-latency"]) {
      assert.equal(await attr("window-ms", id), 60_000, id);
      assert.equal((await attr("to-ms", id)) - (await attr("from-ms", id)), 60_000, id);
    }
    assert.deepEqual(await labels(), ["now", "-15s", "-30s", "-45s", "-1m"]);
    const x1 = await firstX(page, "#chart-throughput");
    assert.ok(x1 < x5, `the first point at x=${x1} in 1 min, x=${x5} in 5 min`);
    const points1 = await attr("points");

    // 15 minutes: ticks every 3 minutes, every point the server holds.
    await page.getByRole("button", { name: "15 min" }).click();
    assert.deepEqual(await labels(), ["now", "-3m", "-6m", "-9m", "-12m", "-15m"]);
    assert.equal((await attr("to-ms")) - (await attr("from-ms")), 900_000);
    assert.ok((await firstX(page, "#chart-throughput")) > x5);
    assert.ok((await attr("points")) >= points1);
    const history = await (await fetch(`${server.baseUrl}/ui/api/history`)).json();
    assert.ok((await attr("points")) >= history.unix_ms.length - 2, "15 min shows less than the server holds");

    // The choice is kept for the next visit.
    await page.reload();
    await page.locator("#chart-throughput[data-window-ms]").waitFor();
    assert.deepEqual(await pressed(), ["15 min"]);
    assert.equal(await attr("window-ms"), 900_000);
    await mkdir(OUT, { recursive: true });
    await page.locator("#load").screenshot({ path: join(OUT, "load.png") });
    assert.deepEqual(errors, []);
  } finally {
    await page.close();
  }
});

/**
 * headlineAndRows reads, in one go, the throughput chart's headline (its
 * value and its text) and the experts table's rows/s (values and texts).
 */
function headlineAndRows(page) {
  return page.evaluate(() => {
    const chart = document.querySelector("#chart-throughput");
    const cells = [...document.querySelectorAll("#experts tbody td.rows")];
    return {
      value: Number(chart.dataset.current),
      text: chart.querySelector(".value").textContent,
      rows: cells.map((c) => Number(c.dataset.rows)),
      texts: cells.map((c) => c.textContent),
    };
  });
}

/** num reads a number as fmt prints it: "611", "1.22k", "2.5M". */
function num(text) {
  const m = /^(-?[\d.]+)([kMG]?)/.exec(text.trim());
  assert.ok(m, `not a number: ${text}`);
  return Number(m[1]) * { "": 1, k: 1e3, M: 1e6, G: 1e9 }[m[2]];
}

test("the throughput headline is the sum of the experts' rows/s, under load and after it", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const check = async (when) => {
    const h = await headlineAndRows(page);
    assert.equal(h.rows.length, 3, when);
    const sum = h.rows.reduce((a, b) => a + b, 0);
    assert.ok(Math.abs(h.value - sum) <= 1e-9 * Math.max(1, sum), `${when}: headline ${h.value}, experts' sum ${sum} (${h.rows})`);
    // What a reader adds up: the texts, each rounded to 3 digits.
    const shown = h.texts.map(num).reduce((a, b) => a + b, 0);
    assert.ok(Math.abs(num(h.text) - shown) <= 0.01 * Math.max(shown, 100), `${when}: headline "${h.text}", experts ${h.texts.join(" + ")}`);
    return h;
  };
  try {
    await page.goto(`${server.baseUrl}/ui/`);
    await page.locator("#experts tbody td.rows").first().waitFor();
    const loads = [forwardLoad(server.baseUrl, 2, 16, "ffn.0"), forwardLoad(server.baseUrl, 2, 16, "ffn.1")];
    try {
      await page.waitForFunction(() => {
        const r = [...document.querySelectorAll("#experts tbody td.rows")].map((c) => Number(c.dataset.rows));
        return r.length === 3 && r[0] > 50 && r[1] > 50;
      }, null, { timeout: 60_000, polling: 250 });
      for (let i = 0; i < 3; i++) {
        const h = await check(`under load, poll ${i}`);
        assert.ok(h.value > 0);
        await page.waitForTimeout(1000);
      }
    } finally {
      for (const l of loads) await l.stop();
    }
    // After the load stops, the two fall together: no window of one
    // keeps the rate that the other dropped.
    for (let i = 0; i < 4; i++) {
      await page.waitForTimeout(1000);
      await check(`${i + 1} s after the load`);
    }
    assert.deepEqual(errors, []);
  } finally {
    await page.close();
  }
});

test("the experts table shows each expert's last checkpoint once it is saved", async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  try {
    await page.goto(`${server.baseUrl}/ui/`);
    const ck = page.locator("#experts tbody tr[data-uid='ffn.2'] td.checkpoint");
    await ck.waitFor();
    assert.equal(await ck.innerText(), "–");
    assert.equal(await page.locator("#experts thead th:nth-child(12)").innerText(), "last checkpoint");
    // Train ffn.2 a step, then save it (the server is on loopback
    // without tenants: its CheckpointService takes no token there).
    const x = { dtype: "DTYPE_FLOAT32", shape: ["1", String(HIDDEN)], data: Buffer.alloc(4 * HIDDEN, 1).toString("base64") };
    const post = async (path, body) => {
      const res = await fetch(`${server.baseUrl}/moehost.v1.${path}`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      const text = await res.text();
      assert.equal(res.status, 200, text);
      return JSON.parse(text);
    };
    await post("ExpertService/Backward", { uid: "ffn.2", inputs: [x], gradOutputs: [x] });
    const saved = await post("CheckpointService/Save", { uid: "ffn.2" });
    const step = saved.checkpoint.step;
    assert.ok(Number(step) >= 1, JSON.stringify(saved));
    await ck.filter({ hasText: new RegExp(`^step ${step} · \\d\\d:\\d\\d:\\d\\d$`) }).waitFor({ timeout: 10_000 });
    assert.equal(await ck.getAttribute("data-step"), String(step));
    assert.match(await ck.getAttribute("title"), new RegExp(`^step ${step}, written `));
    // The others have none.
    assert.equal(await page.locator("#experts tbody tr[data-uid='ffn.1'] td.checkpoint").innerText(), "–");
    // Without --tenants there are no tenants or modules to show.
    assert.ok(await page.locator("#tenants").isHidden());
    assert.ok(await page.locator("#modules").isHidden());
    assert.deepEqual(errors, []);
  } finally {
    await page.close();
  }
});

test("under --tenants, the tenants and modules sections show what the token may see, and never a token", async () => {
  const dir = mkdtempSync(join(tmpdir(), "moehost-web-tenants-"));
  const file = join(dir, "tenants.json");
  const cli = (...args) => execFileSync(process.env.MOEHOST_BIN, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, MOEHOST_TOKEN: "" } }).trim().split("\n").at(-1);
  const alice = cli("tenant", "add", "alice", "--prefix", "alice", "--tenants", file);
  const bob = cli("tenant", "add", "bob", "--prefix", "bob", "--prefix", "shared.bob", "--tenants", file);
  const admin = "admin-" + alice.slice(0, 8);
  const srv = await startServer(["--tenants", file, "--admin-token", admin, "--no-dht", "--no-checkpoints", "--experts", "ffn.0", "--module", "ffn-c", "--hidden-dim", "8"]);
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  try {
    const digest = cli("upload", "--server", srv.baseUrl, "--token", alice, "--name", "ffn-c", FFN_C);
    cli("deploy", "--server", srv.baseUrl, "--token", alice, "--module", digest, "--experts", "alice.ffn.[0:2]", "--config", "hidden_dim=8");
    cli("deploy", "--server", srv.baseUrl, "--token", alice, "--module", digest, "--experts", "alice.secret.0", "--config", "hidden_dim=8", "--forward-access", "owner");

    // The experts' rates and checkpoints name only the experts that
    // ListExperts lists to the same token: not alice's private one to
    // anyone else.
    const uidsFor = async (token) => {
      const res = await fetch(`${srv.baseUrl}/ui/api/experts`, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
      const text = await res.text();
      return res.ok ? JSON.parse(text).experts.map((x) => x.uid) : res.status;
    };
    assert.deepEqual(await uidsFor(""), ["alice.ffn.0", "alice.ffn.1", "ffn.0"]);
    assert.deepEqual(await uidsFor(bob), ["alice.ffn.0", "alice.ffn.1", "ffn.0"]);
    assert.deepEqual(await uidsFor(alice), ["alice.ffn.0", "alice.ffn.1", "alice.secret.0", "ffn.0"]);
    assert.deepEqual(await uidsFor(admin), ["alice.ffn.0", "alice.ffn.1", "alice.secret.0", "ffn.0"]);
    assert.equal(await uidsFor("not-a-token"), 401);

    await page.goto(`${srv.baseUrl}/ui/`);
    // Without a token: both sections, saying what to enter.
    const note = page.locator("#tenants-note");
    await note.waitFor({ timeout: 30_000 });
    assert.match(await note.innerText(), /need a token.*admin-token/);
    assert.ok(await page.locator("#modules-note").isVisible());
    assert.equal(await page.locator("#tenants-table tbody tr").count(), 0);
    // alice's public experts are listed to anyone, as ListExperts does.
    await page.locator("#experts tbody tr[data-uid='alice.ffn.1']").waitFor();

    const signIn = async (token) => {
      await page.fill("#token", token);
      await page.locator("#token").dispatchEvent("change");
    };
    const tenantRows = page.locator("#tenants-table tbody tr");
    const moduleRows = page.locator("#modules-table tbody tr");

    // The admin token: every tenant, every module, the operator's too.
    await signIn(admin);
    await tenantRows.nth(1).waitFor({ timeout: 10_000 });
    assert.deepEqual(await tenantRows.evaluateAll((trs) => trs.map((tr) => tr.dataset.tenant)), ["alice", "bob"]);
    assert.match(await page.locator('#tenants-table tr[data-tenant="alice"]').innerText(), /^alice\s+alice\s+1\s+1\s+alice\.ffn\.0, alice\.ffn\.1, alice\.secret\.0$/);
    assert.match(await page.locator('#tenants-table tr[data-tenant="bob"]').innerText(), /^bob\s+bob, shared\.bob\s+1\s+0\s+–$/);
    const aliceModule = page.locator(`#modules-table tr[data-owner="alice"][data-digest="${digest}"]`);
    await aliceModule.waitFor();
    assert.match(await aliceModule.innerText(), new RegExp(`^alice\\s+ffn-c\\s+${digest.slice(7, 19)}\\s.*alice\\.ffn\\.0, alice\\.ffn\\.1, alice\\.secret\\.0$`));
    assert.equal(await aliceModule.locator("td.digest").getAttribute("title"), digest);
    const operator = page.locator('#modules-table tr[data-owner=""]');
    assert.ok((await operator.count()) >= 1, "the operator's module is not listed");
    assert.match(await operator.first().innerText(), /^operator\s.*ffn\.0$/);
    assert.equal(await page.locator("#tenant-count").innerText(), "2 tenants");

    // alice's token: alice alone.
    await signIn(alice);
    await page.waitForFunction(() => document.querySelectorAll("#tenants-table tbody tr").length === 1, null, { timeout: 10_000 });
    assert.deepEqual(await tenantRows.evaluateAll((trs) => trs.map((tr) => tr.dataset.tenant)), ["alice"]);
    assert.deepEqual(await moduleRows.evaluateAll((trs) => trs.map((tr) => tr.dataset.owner)), ["alice"]);

    // No token, nor a token's hash, is on the page or in what it reads.
    const hashes = JSON.parse(readFileSync(file, "utf8")).tenants.flatMap((t) => t.token_hashes).map((h) => h.replace(/^sha256:/, ""));
    assert.equal(hashes.length, 2);
    const html = await page.evaluate(() => document.body.outerHTML);
    const asAdmin = await (await fetch(`${srv.baseUrl}/ui/api/tenants`, { headers: { Authorization: `Bearer ${admin}` } })).text();
    for (const secret of [alice, bob, admin, ...hashes]) {
      assert.ok(!html.includes(secret), "the page shows a token or its hash");
      assert.ok(!asAdmin.includes(secret), "/ui/api/tenants holds a token or its hash");
    }
    await mkdir(OUT, { recursive: true });
    await signIn(admin);
    await tenantRows.nth(1).waitFor({ timeout: 10_000 });
    await page.screenshot({ path: join(OUT, "tenants.png"), fullPage: true });
    assert.deepEqual(errors, []);
  } finally {
    await page.close();
    await srv.stop();
    rmSync(dir, { recursive: true, force: true });
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

test("over https the dashboard loads, lists the experts and runs a Forward, on HTTP/2", async () => {
  // The CA is made now; Chromium trusts the server's key alone, by its
  // SPKI hash, and no other certificate error.
  const ca = makeCA();
  const tlsServer = await startServer([
    "--tls-cert", ca.cert, "--tls-key", ca.key,
    "--module", "nop", "--hidden-dim", "4", "--experts", "nop.[0:2]", "--no-dht",
  ]);
  const tlsBrowser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: [...CHROMIUM_ARGS, `--ignore-certificate-errors-spki-list=${ca.spki}`],
  });
  try {
    assert.match(tlsServer.baseUrl, /^https:\/\//);
    const page = await tlsBrowser.newPage({ viewport: { width: 1280, height: 900 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    // Every failed load but the favicon's (the dashboard has none) and
    // the tenants panel's (served with --tenants only).
    const expected = /\/(favicon\.ico|ui\/api\/tenants)$/;
    page.on("response", (r) => r.status() >= 400 && !expected.test(r.url()) && errors.push(`${r.status()} ${r.url()}`));
    page.on("requestfailed", (r) => errors.push(`${r.failure()?.errorText} ${r.url()}`));
    await page.goto(`${tlsServer.baseUrl}/ui/`);
    const rows = page.locator("#experts tbody tr");
    await rows.first().waitFor();
    assert.deepEqual(await rows.evaluateAll((trs) => trs.map((tr) => tr.dataset.uid)), ["nop.0", "nop.1"]);
    assert.equal(await page.locator("#conn-text").innerText(), "live");
    await page.selectOption("#forward-uid", "nop.1");
    await page.fill("#forward-rows", "3");
    await page.click("#forward-run");
    await page.locator("#forward-shape").filter({ hasText: "[3, 4]" }).waitFor({ timeout: 30_000 });
    // Every call the page made went over TLS, on h2 by ALPN.
    const calls = await page.evaluate(() =>
      performance.getEntriesByType("resource").map((e) => [new URL(e.name).protocol, e.nextHopProtocol]));
    assert.ok(calls.some(([, p]) => p === "h2"), JSON.stringify(calls));
    for (const [scheme, proto] of calls) assert.deepEqual([scheme, proto], ["https:", "h2"]);
    assert.deepEqual(errors, []);
    await page.close();

    // A browser that does not trust the key gets no page.
    const bare = await tlsBrowser.browserType().launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", args: CHROMIUM_ARGS });
    try {
      const p = await bare.newPage();
      await assert.rejects(p.goto(`${tlsServer.baseUrl}/ui/`), /ERR_CERT_AUTHORITY_INVALID/);
    } finally {
      await bare.close();
    }
  } finally {
    await tlsBrowser.close();
    await tlsServer.stop();
    ca.remove();
  }
});
