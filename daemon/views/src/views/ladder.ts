// The ladder diagram of pcap_sequence_diagram: one lifeline per participant, one arrow per message (the
// reply's `participants` and `messages`: the model that writes its Mermaid), failures and rejects in red
// with their cause; a click on an arrow shows that frame's tree (pcap_frame_detail). Zoom and scroll;
// "Load more" appends the next page (next_offset) of the same selection.
import "../lib/style.css";
import { showFrame } from "../lib/tree";
import { byId, captureArgs, isObject, status, svg, View, type Json } from "../lib/view";

interface Participant { id: string; name: string; role: string | null }
interface Message { frame: number; time: number; from: string; to: string; label: string; failed: boolean;
                    notes: string[] }

const COLUMN = 190;  // px between lifelines
const ROW = 26;      // px per message
const TOP = 44;      // the participants' boxes
const LEFT = 90;     // the time column
const COMMENT = 620; // the comment column, right of the lifelines: each message's whole label
const CHAR = 6.6;    // px per character of the labels' monospace font

const statusLine = byId("status");
const scroller = byId("scroller");
const detail = byId("detail");
let participants: Participant[] = [];
let messages: Message[] = [];
let capture: Json = {};
let selection: Json = {};
let nextOffset: number | null = null;
let zoom = 1;

function text(value: unknown): string {
  return value === null || value === undefined ? "" : String(value);
}

function readParticipants(result: Json): Participant[] {
  const raw = Array.isArray(result.participants) ? result.participants : [];
  return raw.filter(isObject).map((p) => ({ id: text(p.id), name: text(p.name), role: p.role ? text(p.role) : null }));
}

// Messages name their lifelines by this page's participant ids; a page loaded later numbers them anew, so
// lifelines are kept by their name (role, address and port) and every message is mapped to names.
function readMessages(result: Json, names: Map<string, string>): Message[] {
  // A failed arrow's notes: its cause and the verdicts it decided (the reply's `failures`, by frame).
  const notes = new Map<number, string[]>();
  for (const f of (Array.isArray(result.failures) ? result.failures : []).filter(isObject)) {
    const verdicts = Array.isArray(f.verdicts) ? f.verdicts.map(text) : [];
    notes.set(Number(f.frame), [...(f.cause ? [text(f.cause)] : []), ...verdicts]);
  }
  const raw = Array.isArray(result.messages) ? result.messages : [];
  return raw.filter(isObject).map((m) => ({
    frame: Number(m.frame), time: Number(m.time), from: names.get(text(m.from)) ?? text(m.from),
    to: names.get(text(m.to)) ?? text(m.to), label: text(m.label),
    failed: m.failed === true, notes: notes.get(Number(m.frame)) ?? [] }));
}

function merge(result: Json, append: boolean): void {
  const incoming = readParticipants(result);
  const names = new Map(incoming.map((p) => [p.id, p.name]));
  if (!append) { participants = []; messages = []; }
  for (const p of incoming) if (!participants.some((q) => q.name === p.name)) participants.push(p);
  messages = messages.concat(readMessages(result, names));
  nextOffset = typeof result.next_offset === "number" ? result.next_offset : null;
  const matched = typeof result.frames_matched === "number" ? result.frames_matched : messages.length;
  byId("summary").textContent = `${messages.length} of ${matched} messages, ${participants.length} lifelines`;
  byId<HTMLButtonElement>("more").disabled = nextOffset === null;
  status(statusLine, messages.length ? "" : text(result.reason) || "nothing to draw");
  draw();
}

function draw(): void {
  const column = new Map(participants.map((p, i) => [p.name, LEFT + COLUMN / 2 + i * COLUMN]));
  const right = LEFT + Math.max(1, participants.length) * COLUMN;
  const width = right + COMMENT;
  const height = TOP + (messages.length + 1) * ROW;
  const root = svg("svg", { width: width * zoom, height: height * zoom, viewBox: `0 0 ${width} ${height}`,
                            class: "ladder", role: "img" });
  const defs = svg("defs");
  for (const [id, color] of [["ok", "currentColor"], ["fail", "#c62828"]]) {
    const marker = svg("marker", { id: `head-${id}`, viewBox: "0 0 10 10", refX: 10, refY: 5,
                                   markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    marker.appendChild(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: color }));
    defs.appendChild(marker);
  }
  root.appendChild(defs);
  for (const p of participants) {
    const x = column.get(p.name) ?? 0;
    const box = svg("g", { class: "participant" });
    box.appendChild(svg("rect", { x: x - COLUMN / 2 + 6, y: 4, width: COLUMN - 12, height: 30, rx: 4 }));
    box.appendChild(svg("text", { x, y: 24, "text-anchor": "middle" }, p.name));
    box.appendChild(svg("title", {}, p.name));
    root.appendChild(box);
    root.appendChild(svg("line", { x1: x, y1: TOP - 10, x2: x, y2: height, class: "lifeline" }));
  }
  const start = messages.length ? messages[0].time : 0;
  messages.forEach((m, i) => {
    const y = TOP + (i + 1) * ROW;
    const x1 = column.get(m.from) ?? LEFT, x2 = column.get(m.to) ?? LEFT;
    const arrow = svg("g", { class: m.failed ? "arrow failed" : "arrow", "data-frame": m.frame });
    arrow.appendChild(svg("text", { x: 4, y: y - 4, class: "time" }, `${(m.time - start).toFixed(3)}`));
    if (x1 === x2) {
      arrow.appendChild(svg("path", { d: `M${x1},${y - 8} h30 v10 h-28`, fill: "none",
                                      "marker-end": `url(#head-${m.failed ? "fail" : "ok"})` }));
    } else {
      arrow.appendChild(svg("line", { x1, y1: y, x2: x2 + (x2 > x1 ? -2 : 2), y2: y,
                                      "marker-end": `url(#head-${m.failed ? "fail" : "ok"})` }));
    }
    if (m.failed) arrow.appendChild(svg("text", { x: (x1 + x2) / 2 - 4, y: y + 4, class: "cross" }, "✕"));
    // Above the arrow as much of the label as fits between its lifelines; the whole of it on the right.
    const fits = Math.max(8, Math.floor((Math.abs(x2 - x1) - 10) / CHAR));
    const short = m.label.length > fits ? `${m.label.slice(0, fits - 1)}…` : m.label;
    arrow.appendChild(svg("text", { x: Math.min(x1, x2) + 6, y: y - 5, class: "label" }, short));
    arrow.appendChild(svg("text", { x: right + 8, y: y - 2, class: "comment" }, m.label));
    // A wide invisible band: the arrow is easy to click.
    arrow.appendChild(svg("rect", { x: Math.min(x1, x2), y: y - ROW + 4, width: Math.max(Math.abs(x2 - x1), 34),
                                    height: ROW - 2, class: "hit" }));
    arrow.appendChild(svg("title", {}, [m.label, ...m.notes].join("\n")));
    arrow.addEventListener("click", () => void open(arrow, m.frame));
    root.appendChild(arrow);
  });
  scroller.replaceChildren(root);
}

async function open(arrow: SVGGElement, frame: number): Promise<void> {
  await showFrame(view, capture, frame, arrow, scroller.querySelectorAll(".arrow.selected"), detail, statusLine);
}

async function more(): Promise<void> {
  if (nextOffset === null) return;
  status(statusLine, "loading…");
  try {
    merge(await view.call("pcap_sequence_diagram", { ...selection, offset: nextOffset }), true);
  } catch (err) {
    status(statusLine, err instanceof Error ? err.message : String(err), true);
  }
}

const view = new View("ladder diagram", (result, args) => {
  capture = captureArgs(args);
  selection = Object.fromEntries(Object.entries(args).filter(([k]) => k !== "offset"));
  merge(result, false);
}, (message) => status(statusLine, message, true));

byId("zoom-in").addEventListener("click", () => { zoom = Math.min(4, zoom * 1.25); draw(); });
byId("zoom-out").addEventListener("click", () => { zoom = Math.max(0.2, zoom / 1.25); draw(); });
byId("more").addEventListener("click", () => void more());

void view.connect().catch((err: unknown) => status(statusLine, `no host: ${String(err)}`, true));
