// The procedure durations of ngap_ue_sessions: per UE context its procedures (the reply's view=procedures:
// start, duration_ms, outcome, cause, the rule that decided it) as bars on one time axis, coloured by
// outcome; a reject or failure carries its cause and rule as text beside the bar and in its tooltip. A
// result of view=contexts has no durations: the view asks the same question with view=procedures through
// the host. A click on a bar shows the tree of the frame that decided the outcome (pcap_frame_detail).
import "../lib/style.css";
import { showFrame } from "../lib/tree";
import { byId, captureArgs, isObject, status, svg, View, type Json } from "../lib/view";

interface Procedure { ue: string; name: string; start: number; ms: number; outcome: string; cause: string;
                      rule: string; first: number; last: number; frames: number[]; iso: string }
interface Ue { ue: string; about: string; procedures: Procedure[] }

const LABEL = 260;   // the procedures' names
const ROW = 20;      // px per procedure
const HEAD = 22;     // px per UE's heading
const TOP = 30;      // the time axis
const CHAR = 6.7;    // px per character of the monospace font
const PLOT = 560;    // the time axis' width at zoom 1

const statusLine = byId("status");
const scroller = byId("scroller");
const detail = byId("detail");
const failedOnly = byId<HTMLInputElement>("failed-only");
let capture: Json = {};
let ues: Ue[] = [];
let asked: Json = {};  // the procedures question of the UEs shown
let nextOffset = 0;  // its next page's
let total = 0;
let zoom = 1;

function text(value: unknown): string {
  return value === null || value === undefined ? "" : String(value);
}

/** An ISO time with microseconds (as the reply gives it) in ms since the epoch, keeping the microseconds. */
function epochMs(iso: string): number {
  const m = /^(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$/.exec(iso);
  if (!m) return Number.NaN;
  return Date.parse(`${m[1]}${m[3]}`) + Number(`0${m[2] ?? ""}`) * 1000;
}

function causeText(cause: unknown): string {
  if (!isObject(cause)) return text(cause);
  const name = text(cause.name);
  return `${text(cause.kind)} ${text(cause.code)}${name ? ` ${name}` : ""}`.trim();
}

function read(result: Json): Ue[] {
  return (Array.isArray(result.ues) ? result.ues : []).filter(isObject).map((u) => ({
    ue: text(u.ue),
    about: [u.gnb ? `gNB ${text(u.gnb)}` : "", u.amf_ue_ngap_id !== undefined ? `AMF id ${text(u.amf_ue_ngap_id)}` : "",
            u.ran_ue_ngap_id !== undefined ? `RAN id ${text(u.ran_ue_ngap_id)}` : ""].filter(Boolean).join(", "),
    procedures: (Array.isArray(u.procedures) ? u.procedures : []).filter(isObject)
      .filter((p) => typeof p.duration_ms === "number" || typeof p.start === "string")
      .map((p) => ({
        ue: text(u.ue),
        name: text(p.procedure) + (p.pdu_session_id !== undefined ? ` (PDU session ${text(p.pdu_session_id)})` : ""),
        start: epochMs(text(p.start)), ms: typeof p.duration_ms === "number" ? p.duration_ms : 0,
        outcome: text(p.outcome) || "incomplete", cause: causeText(p.cause), rule: text(p.rule),
        first: Number(p.first_frame), last: Number(p.last_frame), iso: text(p.start),
        frames: Array.isArray(p.frames) ? p.frames.map(Number) : [] })),
  }));
}

function hasProcedures(result: Json): boolean {
  return (Array.isArray(result.ues) ? result.ues : []).filter(isObject).some((u) =>
    (Array.isArray(u.procedures) ? u.procedures : []).some((p) => isObject(p) && "duration_ms" in p));
}

function ticks(span: number, count: number): number[] {
  if (span <= 0) return [0];
  const raw = span / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) ?? raw;
  const out: number[] = [];
  for (let v = 0; v <= span + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

function bad(p: Procedure): boolean {
  return p.outcome === "reject" || p.outcome === "failure";
}

/** Right of the plot: the duration; for a reject or failure its cause and the rule that decided it. */
function note(p: Procedure): string {
  return `${p.ms} ms` + (bad(p) ? ` ${p.outcome}${p.cause ? `: ${p.cause}` : ""}${p.rule ? ` — ${p.rule}` : ""}` : "");
}

function draw(): void {
  const shown = ues.map((u) => ({ ...u, procedures: u.procedures.filter((p) =>
    !failedOnly.checked || bad(p)) }))
    .filter((u) => u.procedures.length);
  const all = shown.flatMap((u) => u.procedures).filter((p) => Number.isFinite(p.start));
  const t0 = all.length ? Math.min(...all.map((p) => p.start)) : 0;
  const span = Math.max(1e-3, ...all.map((p) => p.start + p.ms - t0));
  const plot = PLOT * zoom;
  const x = (ms: number): number => LABEL + (ms / span) * plot;
  const notes = shown.flatMap((u) => u.procedures).map(note);
  const width = LABEL + plot + 16 + CHAR * Math.max(12, ...notes.map((n) => n.length));
  const height = TOP + shown.reduce((h, u) => h + HEAD + u.procedures.length * ROW, 0) + 8;
  const root = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "procedures", role: "img" });
  const axis = svg("g", { class: "axis" });
  for (const t of ticks(span, Math.max(4, Math.round(6 * zoom)))) {
    axis.appendChild(svg("line", { x1: x(t), x2: x(t), y1: TOP - 6, y2: height, class: "grid" }));
    axis.appendChild(svg("text", { x: x(t), y: TOP - 10, "text-anchor": "middle" }, `${t} ms`));
  }
  root.appendChild(axis);
  let y = TOP;
  for (const u of shown) {
    const group = svg("g", { class: "ue", "data-ue": u.ue });
    group.appendChild(svg("text", { x: 4, y: y + 15, class: "ue-name" }, `${u.ue}${u.about ? `  ${u.about}` : ""}`));
    y += HEAD;
    for (const p of u.procedures) {
      const g = svg("g", { class: `proc ${p.outcome}`, "data-ue": p.ue, "data-procedure": p.name,
                           "data-outcome": p.outcome, "data-start": p.iso, "data-duration": p.ms,
                           "data-first-frame": p.first, "data-last-frame": p.last });
      g.appendChild(svg("rect", { x: 0, y, width, height: ROW, class: "band" }));
      g.appendChild(svg("text", { x: LABEL - 8, y: y + 14, "text-anchor": "end", class: "name" },
                        p.name.length > 37 ? `${p.name.slice(0, 36)}…` : p.name));
      const left = Number.isFinite(p.start) ? x(p.start - t0) : LABEL;
      const bar = svg("rect", { x: left, y: y + 4, width: Math.max(2, x(p.ms) - LABEL), height: ROW - 8,
                                class: "bar" });
      g.appendChild(bar);
      const end = Math.max(left + 2, x(p.start - t0 + p.ms));
      if (bad(p)) g.appendChild(svg("text", { x: end + 2, y: y + 14, class: "cross" }, "✕"));
      g.appendChild(svg("text", { x: LABEL + plot + 8, y: y + 14, class: "note" }, note(p)));
      g.appendChild(svg("title", {}, [`${p.name}: ${p.outcome}`, `start ${p.iso}, ${p.ms} ms`,
                                      p.cause ? `cause: ${p.cause}` : "", p.rule ? `rule: ${p.rule}` : "",
                                      `frames ${p.frames.join(", ")}`].filter(Boolean).join("\n")));
      g.addEventListener("click", () => void open(g, p.last));
      group.appendChild(g);
      y += ROW;
    }
    root.appendChild(group);
  }
  scroller.replaceChildren(root);
}

/** A page of UE contexts (the tool pages them: `offset`, `has_more`), appended to those shown or instead. */
function show(result: Json, args: Json, append = false): void {
  const page = read(result);
  ues = append ? ues.concat(page) : page;
  asked = args;
  nextOffset = (typeof result.offset === "number" ? result.offset : 0) + page.length;
  total = typeof result.ue_count === "number" ? result.ue_count : ues.length;
  byId<HTMLButtonElement>("more").disabled = result.has_more !== true;
  const procedures = ues.flatMap((u) => u.procedures);
  byId("summary").textContent = `${ues.length === total ? "" : `${ues.length} of `}${total} UE contexts, ` +
    `${procedures.length} procedures, ${procedures.filter(bad).length} failed or rejected`;
  status(statusLine, procedures.length ? "" : text(result.reason) || "no procedure");
  draw();
}

async function open(g: SVGGElement, frame: number): Promise<void> {
  await showFrame(view, capture, frame, g, scroller.querySelectorAll(".proc.selected"), detail, statusLine);
}

const view = new View("UE procedures", (result, args) => {
  capture = captureArgs(args);
  if (hasProcedures(result) || args.view === "procedures") {
    show(result, args);
    return;
  }
  // view=contexts: the same UEs' procedures with their durations, through the host.
  void ask({ ...args, view: "procedures" }, false);
}, (message) => status(statusLine, message, true));

async function ask(args: Json, append: boolean): Promise<void> {
  await view.ask("ngap_ue_sessions", args, statusLine, "loading the procedures…", (r) => show(r, args, append));
}

byId("more").addEventListener("click", () => void ask({ ...asked, view: "procedures", offset: nextOffset }, true));

failedOnly.addEventListener("change", draw);
byId("zoom-in").addEventListener("click", () => { zoom = Math.min(16, zoom * 1.5); draw(); });
byId("zoom-out").addEventListener("click", () => { zoom = Math.max(0.25, zoom / 1.5); draw(); });

void view.connect().catch((err: unknown) => status(statusLine, `no host: ${String(err)}`, true));
