// A small time-series chart drawn as inline SVG: no chart library, a few
// hundred bytes of code per update.

const SVG = "http://www.w3.org/2000/svg";
const W = 300;
const H = 100;

export interface Series {
  label: string;
  className: string;
}

export class Chart {
  private readonly values: number[][];
  private readonly svg: SVGSVGElement;
  private readonly current: HTMLElement;
  private readonly maxLabel: HTMLElement;

  constructor(
    private readonly el: HTMLElement,
    title: string,
    private readonly unit: string,
    private readonly series: Series[],
    private readonly capacity = 60,
    private readonly minSpan = 60,
  ) {
    this.values = series.map(() => []);
    el.innerHTML = "";
    const head = document.createElement("figcaption");
    const name = document.createElement("span");
    name.textContent = title;
    this.current = document.createElement("span");
    this.current.className = "value";
    head.append(name, this.current);
    this.svg = document.createElementNS(SVG, "svg");
    this.svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    this.svg.setAttribute("preserveAspectRatio", "none");
    this.svg.setAttribute("role", "img");
    this.svg.setAttribute("aria-label", title);
    for (const s of series) {
      const area = document.createElementNS(SVG, "path");
      area.setAttribute("class", `area ${s.className}`);
      const line = document.createElementNS(SVG, "path");
      line.setAttribute("class", `line ${s.className}`);
      this.svg.append(area, line);
    }
    // The axis label is HTML over the plot: SVG text would stretch with it.
    this.maxLabel = document.createElement("span");
    this.maxLabel.className = "axis";
    const plot = document.createElement("div");
    plot.className = "plot";
    plot.append(this.svg, this.maxLabel);
    el.append(head, plot);
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
  }

  /**
   * append adds a run of values to each series (columns[i] to series i,
   * oldest first), keeps the newest capacity of them, and redraws once.
   */
  append(columns: number[][]): void {
    columns.forEach((col, i) => {
      const arr = this.values[i];
      for (const v of col) arr.push(Number.isFinite(v) ? v : 0);
      if (arr.length > this.capacity) arr.splice(0, arr.length - this.capacity);
    });
    this.draw();
  }

  private draw(): void {
    const max = niceMax(Math.max(0, ...this.values.flat()));
    // The x axis spans the points held, at least minSpan of them, so that
    // a young history fills the plot instead of a sliver of it.
    const step = W / (Math.min(this.capacity, Math.max(this.minSpan, this.values[0].length)) - 1);
    const paths = this.svg.querySelectorAll("path");
    this.values.forEach((arr, i) => {
      const x0 = W - (arr.length - 1) * step;
      const pts = arr.map((v, j) => `${(x0 + j * step).toFixed(1)},${(H - (v / max) * (H - 4)).toFixed(1)}`);
      const line = pts.length ? `M${pts.join("L")}` : "";
      paths[2 * i + 1].setAttribute("d", line);
      paths[2 * i].setAttribute("d", pts.length ? `${line}L${W},${H}L${x0.toFixed(1)},${H}Z` : "");
    });
    this.maxLabel.textContent = fmt(max);
    const last = this.values.map((a) => a[a.length - 1] ?? 0);
    this.current.textContent = `${last.map(fmt).join(" / ")} ${this.unit}`;
    // For tests and for people reading the DOM: how many points, and the latest.
    this.el.dataset.points = String(this.values[0].length);
    this.el.dataset.last = String(last[0]);
    this.el.dataset.max = String(Math.max(0, ...this.values[0]));
  }
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
