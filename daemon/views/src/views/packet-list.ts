// The packet list of pcap_frames_by_filter: Wireshark's columns, a display filter, paging, and a frame's
// decoded tree (pcap_frame_detail) under the list when a row is clicked. Every call goes through the host.
import "../lib/style.css";
import { showFrame } from "../lib/tree";
import { byId, captureArgs, el, status, View, type Json } from "../lib/view";

// Wireshark's default columns, as pcap_frames_by_filter names them; any other key of a row follows.
const COLUMNS: [string, string][] = [["number", "No."], ["time_relative", "Time"], ["src", "Source"],
  ["dst", "Destination"], ["protocol", "Protocol"], ["length", "Length"], ["info", "Info"]];

const filter = byId<HTMLInputElement>("filter");
const limitBox = byId<HTMLSelectElement>("limit");
const statusLine = byId("status");
const detail = byId("detail");
let capture: Json = {};
let offset = 0;
let limit = 50;
let total = 0;
let hasMore = false;

const view = new View("packet list", (result, args) => {
  capture = captureArgs(args);
  filter.value = typeof args.display_filter === "string" ? args.display_filter : "";
  limit = typeof result.limit === "number" ? result.limit : typeof args.limit === "number" ? args.limit : 50;
  if (![...limitBox.options].some((o) => o.value === String(limit))) limitBox.appendChild(el("option", undefined, limit));
  limitBox.value = String(limit);
  show(result);
}, (message) => status(statusLine, message, true));

function cell(value: unknown): string {
  if (value === null || value === undefined) return "";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(6);
  return Array.isArray(value) ? value.map(String).join(",") : String(value);
}

function show(result: Json): void {
  const frames = (Array.isArray(result.frames) ? result.frames : []) as Json[];
  offset = typeof result.offset === "number" ? result.offset : offset;
  total = typeof result.total === "number" ? result.total : frames.length;
  hasMore = result.has_more === true;
  const extra = [...new Set(frames.flatMap((f) => Object.keys(f)))].filter((k) => !COLUMNS.some(([c]) => c === k));
  const columns: [string, string][] = [...COLUMNS, ...extra.map((k): [string, string] => [k, k])];
  byId("head").replaceChildren(...columns.map(([, title]) => el("th", undefined, title)));
  const body = byId("rows");
  body.replaceChildren(...frames.map((frame) => {
    const row = el("tr", undefined, undefined,
      ...columns.map(([key]) => el("td", key === "info" ? "info" : undefined, cell(frame[key]))));
    row.dataset.frame = cell(frame.number);
    row.addEventListener("click", () => void open(row, Number(frame.number)));
    return row;
  }));
  const exact = result.total_exact === false ? "at least " : "";
  byId("range").textContent = frames.length
    ? `${offset + 1}–${offset + frames.length} of ${exact}${total}` : `0 of ${exact}${total}`;
  byId<HTMLButtonElement>("prev").disabled = offset === 0;
  byId<HTMLButtonElement>("next").disabled = !hasMore;
  status(statusLine, frames.length ? "" : typeof result.hint === "string" ? result.hint : "no frame matches");
}

async function load(newOffset: number): Promise<void> {
  status(statusLine, "loading…");
  try {
    const args = { ...capture, display_filter: filter.value, offset: Math.max(0, newOffset), limit };
    show(await view.call("pcap_frames_by_filter", args));
    detail.replaceChildren();
  } catch (err) {
    status(statusLine, err instanceof Error ? err.message : String(err), true);
  }
}

async function open(row: HTMLElement, frame: number): Promise<void> {
  await showFrame(view, capture, frame, row, row.parentElement?.children ?? [], detail, statusLine);
}

// No <form>: a sandboxed frame without allow-forms (as hosts render views) never submits one.
byId("apply").addEventListener("click", () => void load(0));
filter.addEventListener("keydown", (event) => { if (event.key === "Enter") void load(0); });
byId("prev").addEventListener("click", () => void load(offset - limit));
byId("next").addEventListener("click", () => void load(offset + limit));
limitBox.addEventListener("change", () => { limit = Number(limitBox.value); void load(offset); });

void view.connect().catch((err: unknown) => status(statusLine, `no host: ${String(err)}`, true));
