// The graphs of pcap_stats: I/O over time (the io kind's bins, frames or bytes per interval, as bars on a
// time axis), response times (the srt kind: per procedure its min..max as a bar, its average marked, the
// count of pairs), and for every other kind (expert, conversations, endpoints) a table. A kind switcher
// calls pcap_stats again through the host; "Load more" appends the next page of rows.
import "../lib/style.css";
import { byId, captureArgs, el, isObject, status, svg, View, type Json } from "../lib/view";

const WIDTH = 960;     // the chart's drawing width (px, scaled to the frame)
const HEIGHT = 260;    // the I/O chart's plot height
const LEFT = 70;       // the y axis' labels
const BOTTOM = 34;     // the x axis' labels
const SRT_ROW = 24;    // px per procedure
const SRT_LABEL = 300; // the procedures' names

const kindBox = byId<HTMLSelectElement>("kind");
const protocolBox = byId<HTMLInputElement>("protocol");
const intervalBox = byId<HTMLInputElement>("interval");
const metricBox = byId<HTMLSelectElement>("metric");
const statusLine = byId("status");
const chart = byId("chart");
let capture: Json = {};
let filter = "";
let kind = "io";
let asked: Json = {};   // the arguments of the rows shown (for "Load more")
let rows: Json[] = [];
let answer: Json = {};
let nextOffset = 0;  // the row after the last one shown

function text(value: unknown): string {
  if (value === null || value === undefined) return "";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function num(value: unknown): number {
  return typeof value === "number" && Number.isFinite(value) ? value : 0;
}

/** Round tick steps (1, 2, 5 x 10^n) giving about `count` ticks up to `top`. */
function ticks(top: number, count: number): number[] {
  if (top <= 0) return [0];
  const raw = top / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? raw;
  const out: number[] = [];
  for (let v = 0; v <= top + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

function seconds(value: number): string {
  if (value === 0) return "0";
  if (value < 1e-3) return `${(value * 1e6).toPrecision(3)} µs`;
  if (value < 1) return `${(value * 1e3).toPrecision(3)} ms`;
  return `${value.toPrecision(4)} s`;
}

function hover(readout: SVGTextElement, node: SVGElement, said: string): void {
  node.addEventListener("mouseenter", () => { readout.textContent = said; node.classList.add("hot"); });
  node.addEventListener("mouseleave", () => { readout.textContent = ""; node.classList.remove("hot"); });
}

function drawIo(): void {
  const metric = metricBox.value === "bytes" ? "bytes" : "frames";
  const interval = num(answer.interval_ms) || 1000;
  const values = rows.map((r) => num(r[metric]));
  const top = Math.max(1, ...values);
  const yTicks = ticks(top, 5);
  const yMax = Math.max(top, yTicks[yTicks.length - 1]);
  const plot = WIDTH - LEFT - 10;
  const slot = plot / Math.max(1, rows.length);
  const root = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT + BOTTOM + 20}`, width: "100%", class: "io",
                            role: "img", "data-metric": metric });
  const y = (v: number): number => 20 + HEIGHT - (v / yMax) * HEIGHT;
  const axis = svg("g", { class: "axis" });
  for (const t of yTicks) {
    axis.appendChild(svg("line", { x1: LEFT, x2: WIDTH - 10, y1: y(t), y2: y(t), class: "grid" }));
    axis.appendChild(svg("text", { x: LEFT - 6, y: y(t) + 4, "text-anchor": "end" }, String(t)));
  }
  const span = rows.length * interval / 1000;
  for (const t of ticks(span, 8)) {
    const x = LEFT + (t / Math.max(span, 1e-9)) * plot;
    if (x > WIDTH - 10 + 1e-6) continue;
    axis.appendChild(svg("line", { x1: x, x2: x, y1: y(0), y2: y(0) + 4 }));
    axis.appendChild(svg("text", { x, y: y(0) + 16, "text-anchor": "middle" }, `${t} s`));
  }
  axis.appendChild(svg("line", { x1: LEFT, x2: WIDTH - 10, y1: y(0), y2: y(0) }));
  axis.appendChild(svg("line", { x1: LEFT, x2: LEFT, y1: 20, y2: y(0) }));
  axis.appendChild(svg("text", { x: 4, y: 12 }, `${metric} per ${interval} ms`));
  root.appendChild(axis);
  const readout = svg("text", { x: WIDTH - 10, y: 12, "text-anchor": "end", class: "readout" });
  const bars = svg("g", { class: "bars" });
  rows.forEach((r, i) => {
    const v = values[i];
    const start = num(r.start_s);
    const bar = svg("rect", { x: LEFT + i * slot, y: y(v), width: Math.max(0.5, slot * 0.9), height: y(0) - y(v),
                              class: "bar", "data-interval": text(r.interval), "data-frames": num(r.frames),
                              "data-bytes": num(r.bytes), "data-value": v });
    const said = `${start}–${Number((start + interval / 1000).toPrecision(12))} s: ${num(r.frames)} frames, ` +
                 `${num(r.bytes)} bytes`;
    bar.appendChild(svg("title", {}, said));
    hover(readout, bar, said);
    // The whole column is the hover target, also over an empty or low bar.
    const band = svg("rect", { x: LEFT + i * slot, y: 20, width: Math.max(0.5, slot), height: HEIGHT, class: "band" });
    band.appendChild(svg("title", {}, said));
    hover(readout, band, said);
    bars.appendChild(band);
    bars.appendChild(bar);
  });
  root.appendChild(bars);
  root.appendChild(readout);
  chart.replaceChildren(root);
}

function drawSrt(): void {
  const top = Math.max(1e-9, ...rows.map((r) => num(r.max_s)));
  const xTicks = ticks(top, 6);
  const xMax = Math.max(top, xTicks[xTicks.length - 1]);
  const plot = WIDTH - SRT_LABEL - 80;
  const x = (v: number): number => SRT_LABEL + (v / xMax) * plot;
  const height = 30 + rows.length * SRT_ROW + BOTTOM;
  const root = svg("svg", { viewBox: `0 0 ${WIDTH} ${height}`, width: "100%", class: "srt", role: "img" });
  const axis = svg("g", { class: "axis" });
  const bottom = 30 + rows.length * SRT_ROW;
  for (const t of xTicks) {
    axis.appendChild(svg("line", { x1: x(t), x2: x(t), y1: 24, y2: bottom, class: "grid" }));
    axis.appendChild(svg("text", { x: x(t), y: bottom + 16, "text-anchor": "middle" }, seconds(t)));
  }
  axis.appendChild(svg("text", { x: 4, y: 12 }, "response time: min–max bar, | average, (paired count)"));
  root.appendChild(axis);
  const readout = svg("text", { x: WIDTH - 10, y: 12, "text-anchor": "end", class: "readout" });
  rows.forEach((r, i) => {
    const yy = 30 + i * SRT_ROW;
    const count = num(r.count);
    const g = svg("g", { class: count ? "srt" : "srt unpaired", "data-procedure": text(r.procedure),
                         "data-count": count, "data-min": text(r.min_s), "data-avg": text(r.avg_s),
                         "data-max": text(r.max_s) });
    const notPaired = isObject(r.not_paired) ? Object.entries(r.not_paired).map(([why, n]) => `${n} ${why}`) : [];
    const said = `${text(r.procedure)}: ${count} paired` + (count ? `, min ${seconds(num(r.min_s))}, avg ` +
                 `${seconds(num(r.avg_s))}, max ${seconds(num(r.max_s))}` : "") +
                 (notPaired.length ? `; not paired: ${notPaired.join(", ")}` : "");
    g.appendChild(svg("rect", { x: 0, y: yy, width: WIDTH, height: SRT_ROW, class: "band" }));
    const name = text(r.procedure);
    g.appendChild(svg("text", { x: SRT_LABEL - 8, y: yy + 16, "text-anchor": "end", class: "name" },
                      name.length > 44 ? `${name.slice(0, 43)}…` : name));
    if (count) {
      g.appendChild(svg("rect", { x: x(num(r.min_s)), y: yy + 5, height: SRT_ROW - 10, class: "range",
                                  width: Math.max(1.5, x(num(r.max_s)) - x(num(r.min_s))) }));
      g.appendChild(svg("line", { x1: x(num(r.avg_s)), x2: x(num(r.avg_s)), y1: yy + 2, y2: yy + SRT_ROW - 2,
                                  class: "avg" }));
    }
    g.appendChild(svg("text", { x: (count ? x(num(r.max_s)) : SRT_LABEL) + 6, y: yy + 16, class: "count" },
                      count ? `(${count})` : `not paired: ${notPaired.join(", ") || "none"}`));
    g.appendChild(svg("title", {}, said));
    hover(readout, g, said);
    root.appendChild(g);
  });
  root.appendChild(readout);
  chart.replaceChildren(root);
}

function drawTable(): void {
  const columns = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  byId("head").replaceChildren(...columns.map((c) => el("th", undefined, c)));
  byId("rows").replaceChildren(...rows.map((r) => el("tr", undefined, undefined,
    ...columns.map((c) => el("td", undefined, text(r[c]))))));
}

function draw(): void {
  chart.replaceChildren();
  if (kind === "io") drawIo();
  else if (kind === "srt") drawSrt();
  byId("table").hidden = kind === "io";
  if (kind === "io") { byId("head").replaceChildren(); byId("rows").replaceChildren(); } else drawTable();
}

function show(result: Json, args: Json, append: boolean): void {
  answer = result;
  asked = args;
  kind = text(result.kind) || text(args.kind) || "io";
  const page = (Array.isArray(result.rows) ? result.rows : []).filter(isObject);
  rows = append ? rows.concat(page) : page;
  nextOffset = num(result.offset) + page.length;
  kindBox.value = kind;
  if (typeof result.protocol === "string") protocolBox.value = result.protocol;
  if (typeof result.interval_ms === "number") intervalBox.value = String(result.interval_ms);
  const total = num(result.total);
  byId("summary").textContent = `${text(result.kind)}${result.protocol ? ` of ${text(result.protocol)}` : ""}: ` +
    `${rows.length} of ${total} rows` + (kind === "io" ? `, ${num(result.frames)} frames, ${num(result.bytes)} bytes`
      : kind === "srt" ? `, ${num(result.requests)} requests, ${num(result.responses)} responses` : "");
  byId<HTMLButtonElement>("more").disabled = result.has_more !== true;
  metricBox.disabled = kind !== "io";
  intervalBox.disabled = kindBox.value !== "io";
  status(statusLine, text(result.reason) || (rows.length ? "" : "no rows"));
  draw();
}

async function ask(args: Json, append: boolean): Promise<void> {
  await view.ask("pcap_stats", args, statusLine, "loading…", (r) => show(r, args, append));
}

/** The arguments of the kind, protocol and interval chosen: the capture's, and its display filter where the
 * kind takes one (io, srt). As many rows as a page may hold: a graph wants every bin. */
function chosen(): Json {
  const args: Json = { ...capture, kind: kindBox.value, limit: 5000 };
  const protocol = protocolBox.value.trim();
  if (protocol && kindBox.value !== "io" && kindBox.value !== "expert") args.protocol = protocol;
  if (kindBox.value === "io") args.interval_ms = Math.max(1, Math.round(Number(intervalBox.value) || 1000));
  if (filter && (kindBox.value === "io" || kindBox.value === "srt")) args.display_filter = filter;
  return args;
}

const view = new View("statistics", (result, args) => {
  capture = captureArgs(args);
  filter = typeof args.display_filter === "string" ? args.display_filter : "";
  show(result, args, false);
}, (message) => status(statusLine, message, true));

byId("apply").addEventListener("click", () => void ask(chosen(), false));
kindBox.addEventListener("change", () => {
  intervalBox.disabled = kindBox.value !== "io";
  if (kindBox.value !== "srt" || protocolBox.value.trim()) void ask(chosen(), false);
  else status(statusLine, "response times of which protocol? (sip, gtpv2, pfcp, diameter, http, http2)");
});
metricBox.addEventListener("change", () => { if (kind === "io") drawIo(); });
byId("more").addEventListener("click", () => void ask({ ...asked, offset: nextOffset }, true));

void view.connect().catch((err: unknown) => status(statusLine, `no host: ${String(err)}`, true));
