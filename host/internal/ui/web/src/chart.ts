// A small time-series chart drawn as inline SVG: no chart library, a few
// hundred bytes of code per update. The x axis is time: the chart's
// window (1, 5 or 15 minutes) up to its newest point, with ticks labelled
// by how long ago they are ("-30s") and titled with their clock time.

const SVG = "http://www.w3.org/2000/svg";
const W = 300;
const H = 100;

export interface Series {
  label: string;
  className: string;
}

/** The windows the charts offer, in milliseconds. */
export const WINDOWS_MS = [60_000, 300_000, 900_000];

export class Chart {
  private readonly times: number[] = [];
  private readonly values: number[][];
  private readonly svg: SVGSVGElement;
  private readonly grid: SVGGElement;
  private readonly head: HTMLElement;
  private readonly current: HTMLElement;
  private readonly maxLabel: HTMLElement;
  private readonly ticks: HTMLElement;
  private windowMs = WINDOWS_MS[1];
  private headline: number | undefined;

  constructor(
    private readonly el: HTMLElement,
    title: string,
    private readonly unit: string,
    private readonly series: Series[],
    private readonly capacity = 900,
  ) {
    this.values = series.map(() => []);
    el.innerHTML = "";
    this.head = document.createElement("figcaption");
    const name = document.createElement("span");
    name.textContent = title;
    this.current = document.createElement("span");
    this.current.className = "value";
    this.head.append(name, this.current);
    this.svg = document.createElementNS(SVG, "svg");
    this.svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    this.svg.setAttribute("preserveAspectRatio", "none");
    this.svg.setAttribute("role", "img");
    this.svg.setAttribute("aria-label", title);
    this.grid = document.createElementNS(SVG, "g");
    this.grid.setAttribute("class", "grid");
    this.svg.append(this.grid);
    for (const s of series) {
      const area = document.createElementNS(SVG, "path");
      area.setAttribute("class", `area ${s.className}`);
      const line = document.createElementNS(SVG, "path");
      line.setAttribute("class", `line ${s.className}`);
      this.svg.append(area, line);
    }
    // The axis labels are HTML over and under the plot: SVG text would
    // stretch with it.
    this.maxLabel = document.createElement("span");
    this.maxLabel.className = "axis";
    const plot = document.createElement("div");
    plot.className = "plot";
    plot.append(this.svg, this.maxLabel);
    this.ticks = document.createElement("div");
    this.ticks.className = "ticks";
    el.append(this.head, plot, this.ticks);
    if (series.length > 1) {
      const legend = document.createElement("div");
      legend.className = "legend";
      for (const s of series) {
        const item = document.createElement("span");
        item.className = `key ${s.className}`;
        item.textContent = s.label;
        legend.append(item);
      }
      el.append(legend);
    }
    this.draw();
  }

  /**
   * append adds a run of points, at times (Unix milliseconds, oldest
   * first) with columns[i] the values of series i, keeps the newest
   * capacity of them, and redraws once.
   */
  append(times: number[], columns: number[][]): void {
    this.times.push(...times);
    columns.forEach((col, i) => {
      for (const v of col) this.values[i].push(Number.isFinite(v) ? v : 0);
    });
    const drop = this.times.length - this.capacity;
    if (drop > 0) {
      this.times.splice(0, drop);
      for (const arr of this.values) arr.splice(0, drop);
    }
    this.draw();
  }

  /** setWindow shows the last ms milliseconds up to the newest point. */
  setWindow(ms: number): void {
    this.windowMs = ms;
    this.draw();
  }

  /**
   * setHeadline shows v as the chart's current value in place of its
   * first series' newest point (undefined: the newest point again), with
   * a tooltip that says what it is.
   */
  setHeadline(v: number | undefined, title = ""): void {
    this.headline = v;
    this.head.title = title;
    this.draw();
  }

  private draw(): void {
    const n = this.times.length;
    const to = n ? this.times[n - 1] : Date.now();
    const from = to - this.windowMs;
    let first = 0;
    while (first < n && this.times[first] < from) first++;
    const shown = this.values.map((arr) => arr.slice(first));
    const max = niceMax(Math.max(0, ...shown.flat()));
    const x = (t: number) => ((t - from) / this.windowMs) * W;
    const paths = this.svg.querySelectorAll("path");
    shown.forEach((arr, i) => {
      const pts = arr.map((v, j) => `${x(this.times[first + j]).toFixed(1)},${(H - (v / max) * (H - 4)).toFixed(1)}`);
      const line = pts.length ? `M${pts.join("L")}` : "";
      paths[2 * i + 1].setAttribute("d", line);
      const x0 = pts.length ? x(this.times[first]).toFixed(1) : "0";
      paths[2 * i].setAttribute("d", pts.length ? `${line}L${x(to).toFixed(1)},${H}L${x0},${H}Z` : "");
    });
    this.drawTicks(from, to);
    this.maxLabel.textContent = fmt(max);
    const last = this.values.map((a) => a[a.length - 1] ?? 0);
    const current = this.headline ?? last[0];
    const texts = last.map(fmt);
    texts[0] = fmt(current);
    this.current.textContent = `${texts.join(" / ")} ${this.unit}`;
    // For tests and for people reading the DOM: how many points the
    // window shows, the latest, the range of time it spans.
    const d = this.el.dataset;
    d.points = String(shown[0].length);
    d.last = String(last[0]);
    d.current = String(current);
    d.max = String(Math.max(0, ...shown[0]));
    d.windowMs = String(this.windowMs);
    d.fromMs = String(from);
    d.toMs = String(to);
  }

  /** drawTicks labels the x axis from from to to, and draws its grid. */
  private drawTicks(from: number, to: number): void {
    const span = to - from;
    const step = tickStep(span);
    const labels: HTMLElement[] = [];
    const lines: SVGLineElement[] = [];
    for (let ago = 0; ago <= span; ago += step) {
      const t = to - ago;
      const pct = ((t - from) / span) * 100;
      const label = document.createElement("span");
      label.textContent = ago === 0 ? "now" : `-${shortDuration(ago)}`;
      label.title = clock(t);
      label.dataset.t = String(t);
      label.style.left = `${pct.toFixed(2)}%`;
      if (ago === 0) label.className = "right";
      else if (ago + step > span) label.className = "left";
      labels.push(label);
      if (ago > 0 && ago < span) {
        const line = document.createElementNS(SVG, "line");
        const gx = ((pct / 100) * W).toFixed(1);
        line.setAttribute("x1", gx);
        line.setAttribute("x2", gx);
        line.setAttribute("y1", "0");
        line.setAttribute("y2", String(H));
        lines.push(line);
      }
    }
    this.ticks.replaceChildren(...labels);
    this.grid.replaceChildren(...lines);
  }
}

/** tickStep spaces ticks so that a window has four or five of them. */
function tickStep(spanMs: number): number {
  for (const s of [15_000, 30_000, 60_000, 120_000, 180_000, 300_000, 600_000]) if (spanMs / s <= 5) return s;
  return spanMs / 4;
}

/** shortDuration prints a span of milliseconds as "45s", "2m" or "1m 30s". */
export function shortDuration(ms: number): string {
  const s = Math.round(ms / 1000);
  const m = Math.floor(s / 60);
  if (!m) return `${s}s`;
  return s % 60 ? `${m}m ${s % 60}s` : `${m}m`;
}

/** clock prints a Unix time in milliseconds as the local time of day, "14:03:05". */
export function clock(unixMs: number): string {
  return new Date(unixMs).toLocaleTimeString("en-GB", { hour12: false });
}

/** niceMax rounds up to 1, 2 or 5 times a power of ten, so the axis reads well. */
function niceMax(v: number): number {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

/**
 * fmt prints a number in three significant digits or fewer, with k, M or
 * G for thousands, millions and billions; an integer below 10,000 prints
 * as it is ("20", not "20.0").
 */
export function fmt(v: number): string {
  if (!Number.isFinite(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return `${trim((v / 1e9).toPrecision(3))}G`;
  if (a >= 1e6) return `${trim((v / 1e6).toPrecision(3))}M`;
  if (a >= 1e4) return `${trim((v / 1e3).toPrecision(3))}k`;
  if (a >= 100 || Number.isInteger(v)) return v.toFixed(0);
  return v.toPrecision(3);
}

/** count prints a count of things: "1 step", "2 steps", "1.05M params". */
export function count(n: number, one: string, many = `${one}s`): string {
  return `${fmt(n)} ${n === 1 ? one : many}`;
}

/** trim drops a fraction's trailing zeros: "1.20" → "1.2", "20.0" → "20". */
function trim(s: string): string {
  return s.includes(".") ? s.replace(/\.?0+$/, "") : s;
}
