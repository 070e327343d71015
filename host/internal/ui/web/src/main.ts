// The moehost dashboard: polls ListExperts and GetServerInfo over Connect
// from the page's own origin, charts the load the server samples every
// second (/ui/api/history: drawn whole at load, then what is new), shows
// each expert's rate and last checkpoint (/ui/api/experts) and, on a
// server with tenants, its tenants and modules (/ui/api/tenants), and
// runs Forward on random input. See ../ui.go for how it is served.
import {
  ConnectError,
  createMoehostClient,
  DType,
  randomInput,
  shapeOf,
  stats,
  toFloat32Array,
  type ExpertInfo,
  type GetServerInfoResponse,
  type MoehostClient,
  type PoolStats,
  type TensorSchema,
} from "@moehost/client";

import { Chart, WINDOWS_MS, clock, count, fmt, shortDuration } from "./chart";
import "./style.css";

const POLL_MS = 1000;
// The server's history: 15 minutes at one sample a second.
const HISTORY_POINTS = 900;
const TOKEN_KEY = "moehost.token";
const WINDOW_KEY = "moehost.window";

const $ = <T extends HTMLElement = HTMLElement>(sel: string) => document.querySelector<T>(sel)!;

let client: MoehostClient = newClient();
let experts: ExpertInfo[] = [];
let server: GetServerInfoResponse | undefined;
let serverFetchedAt = 0;
// When the slow polls (server info, swarm, tenants: every 5 s) last ran.
let slowPolledAt = 0;

function newClient(): MoehostClient {
  return createMoehostClient({ baseUrl: location.origin, token: sessionStorage.getItem(TOKEN_KEY) ?? undefined });
}

/** authHeaders sends the token field's token, as the Connect client does. */
function authHeaders(): HeadersInit {
  const t = sessionStorage.getItem(TOKEN_KEY);
  return t ? { Authorization: `Bearer ${t}` } : {};
}

// The token lives in session storage: it survives a reload, not the tab.
const tokenInput = $<HTMLInputElement>("#token");
tokenInput.value = sessionStorage.getItem(TOKEN_KEY) ?? "";
tokenInput.addEventListener("change", () => {
  const t = tokenInput.value.trim();
  if (t) sessionStorage.setItem(TOKEN_KEY, t);
  else sessionStorage.removeItem(TOKEN_KEY);
  client = newClient();
  // What the token may see changes: ask for it all again now.
  slowPolledAt = 0;
  void poll();
});

const charts = {
  throughput: new Chart($("#chart-throughput"), "Throughput", "rows/s", [{ label: "rows/s", className: "s0" }], HISTORY_POINTS),
  batch: new Chart($("#chart-batch"), "Mean batch size", "rows", [{ label: "rows", className: "s1" }], HISTORY_POINTS),
  queue: new Chart($("#chart-queue"), "Queue depth", "requests", [{ label: "requests", className: "s2" }], HISTORY_POINTS),
  latency: new Chart($("#chart-latency"), "Latency", "ms", [
    { label: "queue wait, max", className: "s3" },
    { label: "batch run, mean", className: "s0" },
  ], HISTORY_POINTS),
};

// The charts' window: 1, 5 or 15 minutes, kept for the next visit.
const windowButtons = [...document.querySelectorAll<HTMLButtonElement>("#load .windows button")];
function setWindow(ms: number): void {
  for (const c of Object.values(charts)) c.setWindow(ms);
  for (const b of windowButtons) b.setAttribute("aria-pressed", String(Number(b.dataset.windowMs) === ms));
}
for (const b of windowButtons) {
  b.addEventListener("click", () => {
    const ms = Number(b.dataset.windowMs);
    localStorage.setItem(WINDOW_KEY, String(ms));
    setWindow(ms);
  });
}
{
  const kept = Number(localStorage.getItem(WINDOW_KEY));
  setWindow(WINDOWS_MS.includes(kept) ? kept : WINDOWS_MS[1]);
}

/** History is /ui/api/history's body (see ../history.go): columns, oldest first. */
interface History {
  interval_ms: number;
  capacity: number;
  unix_ms: number[];
  rows_per_second: number[];
  mean_batch: number[];
  queue_depth: number[];
  queue_wait_max_ms: number[];
  run_mean_ms: number[];
}

// The newest sample drawn: the next poll asks for what came after it.
let historySince = 0;

/** pollHistory draws the samples the charts have not drawn yet. */
async function pollHistory(): Promise<void> {
  const res = await fetch(`/ui/api/history?since=${historySince}`, { cache: "no-store" });
  if (!res.ok) throw new Error(`/ui/api/history: ${res.status} ${(await res.text()).trim()}`);
  const h = (await res.json()) as History;
  const n = h.unix_ms.length;
  if (!n) return;
  historySince = h.unix_ms[n - 1];
  charts.throughput.append(h.unix_ms, [h.rows_per_second]);
  charts.batch.append(h.unix_ms, [h.mean_batch]);
  charts.queue.append(h.unix_ms, [h.queue_depth]);
  charts.latency.append(h.unix_ms, [h.queue_wait_max_ms, h.run_mean_ms]);
}

/** ExpertsView is /ui/api/experts's body (see ../ui.go). */
interface ExpertsView {
  rate_window_ms: number;
  experts: { uid: string; rows_per_second: number; checkpoint: { step: number; unix_ms: number } | null }[];
}

let expertsView: ExpertsView = { rate_window_ms: 0, experts: [] };

async function pollExpertsView(): Promise<ExpertsView> {
  const res = await fetch("/ui/api/experts", { cache: "no-store", headers: authHeaders() });
  if (!res.ok) throw new Error(`/ui/api/experts: ${res.status} ${(await res.text()).trim()}`);
  return (await res.json()) as ExpertsView;
}

function pools(e: ExpertInfo): PoolStats[] {
  return [e.forwardPool, e.backwardPool].filter((p): p is PoolStats => p !== undefined);
}

/**
 * load sums the experts' pools into the numbers of the experts table
 * (but rows/s, which comes from /ui/api/experts).
 */
function load(list: ExpertInfo[]) {
  let batches = 0;
  let batchRows = 0;
  let queue = 0;
  let wait = 0;
  let run = 0;
  for (const p of list.flatMap(pools)) {
    batches += p.batchesPerSecond;
    batchRows += p.batchesPerSecond * p.meanBatchSize;
    queue += Number(p.queueDepth);
    wait = Math.max(wait, p.queueWaitP99Ms);
    run = Math.max(run, p.runTimeMeanMs);
  }
  return { batch: batches > 0 ? batchRows / batches : 0, queue, wait, run };
}

function schemaText(s: TensorSchema[]): string {
  return s.map((t) => `${t.name}:${DType[t.dtype].replace(/^DTYPE_/, "").toLowerCase()}[${t.shape.join(",")}]`).join(", ");
}

function cell(text: string, className = ""): HTMLTableCellElement {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

/** params is the parameter count in human units, exact in its tooltip. */
function params(n: number): HTMLTableCellElement {
  const td = cell(fmt(n), "num");
  td.title = `${n.toLocaleString("en-US")} parameters`;
  return td;
}

/**
 * renderExperts fills the experts table, and the throughput chart's
 * headline with the sum of its rows/s column: both come from the server's
 * per-expert rates (/ui/api/experts), each over the same window of the
 * same ticks that the chart draws, so that they cannot disagree.
 */
function renderExperts(): void {
  const body = $("#experts tbody");
  const view = new Map(expertsView.experts.map((x) => [x.uid, x]));
  const windowText = shortDuration(expertsView.rate_window_ms);
  let total = 0;
  const rows = experts.map((e) => {
    const tr = document.createElement("tr");
    tr.dataset.uid = e.uid;
    const health = cell(e.healthy ? "healthy" : "failing", `badge ${e.healthy ? "ok" : "bad"}`);
    const digest = e.moduleDigest.replace(/^sha256:/, "");
    const mod = cell(`${digest.slice(0, 12)}`, "mono");
    mod.title = e.moduleDigest;
    const cfg = Object.entries(e.config).map(([k, v]) => `${k}=${v}`).join(" ");
    const schema = cell(`${schemaText(e.inputs)} → ${schemaText(e.outputs)}`, "mono");
    schema.title = cfg;
    const ps = pools(e);
    const l = load([e]);
    const v = view.get(e.uid);
    const rate = v?.rows_per_second ?? 0;
    total += rate;
    const rateCell = cell(fmt(rate), "num rows");
    rateCell.dataset.rows = String(rate);
    rateCell.title = `${rate.toFixed(1)} rows/s, the mean over the last ${windowText}`;
    const ck = cell("–", "num checkpoint muted");
    if (v?.checkpoint) {
      ck.textContent = `step ${v.checkpoint.step} · ${clock(v.checkpoint.unix_ms)}`;
      ck.className = "num checkpoint";
      ck.dataset.step = String(v.checkpoint.step);
      ck.title = `step ${v.checkpoint.step}, written ${new Date(v.checkpoint.unix_ms).toLocaleString()}`;
    }
    tr.append(
      cell(e.uid, "mono uid"),
      health,
      schema,
      mod,
      // Tenants' experts name their owner; the operator's have none.
      cell(e.owner || "operator", e.owner ? "mono owner" : "muted owner"),
      params(Number(e.parameterCount)),
      rateCell,
      cell(l.batch ? l.batch.toFixed(1) : "–", "num"),
      cell(String(l.queue), "num"),
      cell(ps.length ? `${fmt(l.wait)} ms` : "–", "num"),
      cell(count(Number(e.stats?.backwardBatches ?? 0n), "step"), "num"),
      ck,
    );
    return tr;
  });
  body.replaceChildren(...rows);
  const what = `the experts' rows/s summed, each the mean over the last ${windowText}`;
  $("#rows-head").title = `rows/s: the mean over the last ${windowText}`;
  charts.throughput.setHeadline(total, what);
  $("#expert-count").textContent = `${experts.length} hosted`;

  const select = $<HTMLSelectElement>("#forward-uid");
  const uids = experts.map((e) => e.uid);
  if ([...select.options].map((o) => o.value).join() !== uids.join()) {
    const keep = select.value;
    select.replaceChildren(...uids.map((u) => new Option(u, u)));
    if (uids.includes(keep)) select.value = keep;
  }
}

function renderServer(): void {
  const dl = $("#server-info");
  if (!server) return;
  const up = server.uptimeSeconds + (Date.now() - serverFetchedAt) / 1000;
  const items: [string, string][] = [
    ["version", `${server.version} (${server.goVersion})`],
    ["uptime", duration(up)],
    ["listen", server.listenAddress],
    ["devices", server.devices.map((d) => `${d.name}: ${d.description}`).join("; ") || "–"],
    ["experts", String(server.expertCount)],
    ["DHT", server.peerId ? `${server.peers.length} peer${server.peers.length === 1 ? "" : "s"}` : "off"],
  ];
  dl.replaceChildren(
    ...items.flatMap(([k, v]) => {
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = v;
      dd.dataset.key = k;
      return [dt, dd];
    }),
  );
  $("#server-addr").textContent = server.listenAddress;
  renderDHT(server);
}

function listItems(sel: string, values: string[], empty: string): void {
  const items = values.length ? values : [empty];
  $(sel).replaceChildren(
    ...items.map((v) => {
      const li = document.createElement("li");
      li.textContent = v;
      if (!values.length) li.className = "muted";
      return li;
    }),
  );
}

/**
 * renderDHT shows the server's DHT node: its peer id and multiaddrs (what
 * other servers pass to --initial-peers), the URLs its records give, the
 * names it announces, and the peers it knows.
 */
function renderDHT(s: GetServerInfoResponse): void {
  const on = s.peerId !== "";
  $("#dht-on").hidden = !on;
  $("#dht-off").hidden = on;
  $("#dht-summary").textContent = on
    ? `${s.dhtRecords.length} records, ${s.peers.length} peer${s.peers.length === 1 ? "" : "s"}`
    : "off";
  if (!on) return;
  $("#dht-peer-id").textContent = s.peerId;
  listItems("#dht-addrs", s.dhtAddresses, "none");
  listItems("#dht-announce", s.announceAddresses, "none");
  listItems("#dht-records", s.dhtRecords, "none yet");
  $("#dht-peer-count").textContent = `${s.peers.length} known`;
  const rows = s.peers.map((p) => {
    const tr = document.createElement("tr");
    tr.dataset.peer = p.peerId;
    tr.append(cell(p.peerId, "mono"), cell(p.addresses.join("\n") || "–", "mono addrs"));
    return tr;
  });
  if (!rows.length) {
    const tr = document.createElement("tr");
    const td = cell("no peers: a one-node swarm (join one with --initial-peers)", "muted");
    td.colSpan = 2;
    tr.append(td);
    rows.push(tr);
  }
  $("#dht-peers tbody").replaceChildren(...rows);
}

/** Swarm is /ui/api/swarm's body (see ../swarm.go). */
interface Swarm {
  dht: boolean;
  self?: string;
  now_unix_ms: number;
  records: SwarmRecord[];
  total: number;
  limit: number;
}

interface SwarmRecord {
  name: string;
  peer_id: string;
  urls?: string[];
  digest?: string;
  expires_unix_ms: number;
  queue_depth: number;
  samples_per_second: number;
  children?: number[];
}

async function pollSwarm(): Promise<void> {
  const res = await fetch("/ui/api/swarm", { cache: "no-store" });
  if (!res.ok) throw new Error(`/ui/api/swarm: ${res.status} ${(await res.text()).trim()}`);
  renderSwarm((await res.json()) as Swarm);
}

/** short shortens a peer id for a table cell; the cell's title has it whole. */
function peerCell(id: string, self: string | undefined): HTMLTableCellElement {
  const td = cell(id === self ? `${id.slice(0, 16)}… (this server)` : `${id.slice(0, 16)}…`, "mono peer");
  td.title = id;
  return td;
}

/**
 * renderSwarm shows the records the server's DHT node holds: the hosts
 * that signed them (with their URLs, experts and the latest expiry: a host
 * whose records all expire has left) and the experts they announce.
 */
function renderSwarm(sw: Swarm): void {
  $("#swarm-on").hidden = !sw.dht;
  $("#swarm-off").hidden = sw.dht;
  if (!sw.dht) {
    $("#swarm-summary").textContent = "off";
    return;
  }
  const expiresIn = (r: SwarmRecord) => duration(Math.max(0, (r.expires_unix_ms - sw.now_unix_ms) / 1000));
  const uids = sw.records.filter((r) => !r.name.endsWith(".") && (r.urls?.length ?? 0) > 0);
  const hosts = new Map<string, { urls: Set<string>; experts: number; expires: number }>();
  for (const r of sw.records) {
    const h = hosts.get(r.peer_id) ?? { urls: new Set<string>(), experts: 0, expires: 0 };
    for (const u of r.urls ?? []) h.urls.add(u);
    if (uids.includes(r)) h.experts++;
    h.expires = Math.max(h.expires, r.expires_unix_ms);
    hosts.set(r.peer_id, h);
  }
  $("#swarm-summary").textContent = `${count(hosts.size, "host")}, ${count(uids.length, "expert")}`;
  const shown = sw.total > sw.records.length ? `; the first ${sw.records.length} by name are shown` : "";
  $("#swarm-note").textContent =
    `${count(sw.total, "record")} in this server's DHT store${shown}. ` +
    "A swarm of more than 20 servers spreads its records: each holds a share, and \"moehost discover\" looks a grid up.";
  $("#swarm-hosts tbody").replaceChildren(
    ...[...hosts].map(([id, h]) => {
      const tr = document.createElement("tr");
      tr.dataset.peer = id;
      tr.append(
        peerCell(id, sw.self),
        cell([...h.urls].join("\n") || "–", "mono addrs"),
        cell(String(h.experts), "num"),
        cell(duration(Math.max(0, (h.expires - sw.now_unix_ms) / 1000)), "num"),
      );
      return tr;
    }),
  );
  $("#swarm-experts tbody").replaceChildren(
    ...uids.map((r) => {
      const tr = document.createElement("tr");
      tr.dataset.uid = r.name;
      tr.dataset.peer = r.peer_id;
      const mod = cell((r.digest ?? "").replace(/^sha256:/, "").slice(0, 12), "mono");
      mod.title = r.digest ?? "";
      tr.append(
        cell(r.name, "mono uid"),
        peerCell(r.peer_id, sw.self),
        cell((r.urls ?? []).join("\n"), "mono addrs"),
        mod,
        cell(fmt(r.samples_per_second), "num"),
        cell(String(r.queue_depth), "num"),
        cell(expiresIn(r), "num"),
      );
      return tr;
    }),
  );
}

/** TenantsView is /ui/api/tenants's body (see ../ui.go): never a token. */
interface TenantsView {
  tenants: { name: string; prefixes: string[]; tokens: number; modules: number; experts: string[] }[];
  modules: { owner: string; digest: string; name: string; size_bytes: number; uploaded_unix_ms: number; experts: string[] }[];
}

/**
 * pollTenants shows the tenants and modules sections on a server with
 * tenants (404 without): what the token field's token may see, or what
 * to enter to see it.
 */
async function pollTenants(): Promise<void> {
  const res = await fetch("/ui/api/tenants", { cache: "no-store", headers: authHeaders() });
  const on = res.status !== 404;
  $("#tenants").hidden = !on;
  $("#modules").hidden = !on;
  if (!on) return;
  const refused = res.status === 401;
  if (!res.ok && !refused) throw new Error(`/ui/api/tenants: ${res.status} ${(await res.text()).trim()}`);
  const note = refused ? `${(await res.text()).trim()}. Enter it in the token field above.` : "";
  for (const id of ["#tenants-note", "#modules-note"]) {
    $(id).textContent = note;
    $(id).hidden = !refused;
  }
  $("#tenants-table").hidden = refused;
  $("#modules-table").hidden = refused;
  const view: TenantsView = refused ? { tenants: [], modules: [] } : await res.json();
  $("#tenant-count").textContent = refused ? "" : count(view.tenants.length, "tenant");
  $("#module-count").textContent = refused ? "" : count(view.modules.length, "module");
  $("#tenants-table tbody").replaceChildren(
    ...view.tenants.map((t) => {
      const tr = document.createElement("tr");
      tr.dataset.tenant = t.name;
      tr.append(
        cell(t.name, "mono uid"),
        cell(t.prefixes.join(", "), "mono"),
        cell(String(t.tokens), "num"),
        cell(String(t.modules), "num"),
        cell(t.experts.join(", ") || "–", t.experts.length ? "mono experts" : "muted experts"),
      );
      return tr;
    }),
  );
  $("#modules-table tbody").replaceChildren(
    ...view.modules.map((m) => {
      const tr = document.createElement("tr");
      tr.dataset.digest = m.digest;
      tr.dataset.owner = m.owner;
      const digest = cell(m.digest.replace(/^sha256:/, "").slice(0, 12), "mono digest");
      digest.title = m.digest;
      const uploaded = cell(new Date(m.uploaded_unix_ms).toLocaleString(), "");
      tr.append(
        cell(m.owner || "operator", m.owner ? "mono owner" : "muted owner"),
        cell(m.name || "–", m.name ? "" : "muted"),
        digest,
        cell(`${fmt(m.size_bytes)} B`, "num"),
        uploaded,
        cell(m.experts.join(", ") || "–", m.experts.length ? "mono experts" : "muted experts"),
      );
      return tr;
    }),
  );
}

function duration(s: number): string {
  const d = Math.floor(s / 86400);
  const h = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = Math.floor(s % 60);
  return d ? `${d}d ${h}h ${m}m` : h ? `${h}h ${m}m ${sec}s` : m ? `${m}m ${sec}s` : `${sec}s`;
}

function setConnected(ok: boolean, text: string): void {
  $("#conn").className = `dot ${ok ? "ok" : "bad"}`;
  $("#conn-text").textContent = text;
}

function describe(err: unknown): string {
  return err instanceof ConnectError ? `${codeName(err)}: ${err.rawMessage}` : String(err);
}

function codeName(err: ConnectError): string {
  // Code is a numeric enum; print it as the gRPC name users search for.
  const names = ["ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found", "already_exists", "permission_denied", "resource_exhausted", "failed_precondition", "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss", "unauthenticated"];
  return names[err.code] ?? String(err.code);
}

async function poll(): Promise<void> {
  try {
    const now = Date.now();
    const slow = now - slowPolledAt > 5000;
    const [list, view, info] = await Promise.all([
      client.experts.listExperts({}),
      pollExpertsView(),
      slow ? client.info() : Promise.resolve(undefined),
      pollHistory(),
      slow ? pollSwarm() : Promise.resolve(),
      slow ? pollTenants() : Promise.resolve(),
    ]);
    experts = list.experts;
    expertsView = view;
    if (info) {
      server = info;
      serverFetchedAt = now;
      slowPolledAt = now;
    }
    renderExperts();
    setConnected(true, "live");
  } catch (err) {
    setConnected(false, describe(err));
  }
  renderServer();
}

// Forward on random input: the output's shape and statistics, and a
// histogram of its values.
$<HTMLFormElement>("#forward-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const uid = $<HTMLSelectElement>("#forward-uid").value;
  const rows = Number($<HTMLInputElement>("#forward-rows").value);
  const e = experts.find((x) => x.uid === uid);
  const errEl = $("#forward-error");
  const button = $<HTMLButtonElement>("#forward-run");
  errEl.hidden = true;
  if (!e) return;
  button.disabled = true;
  try {
    const inputs = e.inputs.map((s) => randomInput(s, rows));
    const t0 = performance.now();
    const outputs = await client.expert(uid).forward(...inputs);
    const ms = performance.now() - t0;
    const out = outputs[0];
    const values = toFloat32Array(out);
    const st = stats(values);
    $("#forward-input-shape").textContent = inputs.map((t) => `[${shapeOf(t).join(", ")}]`).join(", ");
    $("#forward-shape").textContent = `[${shapeOf(out).join(", ")}]`;
    $("#forward-mean").textContent = `${st.mean.toFixed(4)} ± ${st.std.toFixed(4)}`;
    $("#forward-range").textContent = `${st.min.toFixed(4)} … ${st.max.toFixed(4)}`;
    $("#forward-time").textContent = `${ms.toFixed(1)} ms`;
    histogram(values, st.min, st.max);
    $("#forward-result").hidden = false;
  } catch (err) {
    errEl.textContent = describe(err);
    errEl.hidden = false;
  } finally {
    button.disabled = false;
  }
});

function histogram(values: Float32Array, min: number, max: number): void {
  const bins = new Array<number>(40).fill(0);
  const span = max - min || 1;
  for (const v of values) bins[Math.min(bins.length - 1, Math.floor(((v - min) / span) * bins.length))]++;
  const top = Math.max(...bins);
  const w = 320 / bins.length;
  const svg = $("#forward-hist");
  svg.replaceChildren(
    ...bins.map((b, i) => {
      const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      const h = (b / top) * 58;
      r.setAttribute("x", (i * w + 0.5).toFixed(1));
      r.setAttribute("width", (w - 1).toFixed(1));
      r.setAttribute("y", (60 - h).toFixed(1));
      r.setAttribute("height", h.toFixed(1));
      return r;
    }),
  );
}

void poll();
setInterval(() => void poll(), POLL_MS);
