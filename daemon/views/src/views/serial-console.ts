// The serial console of get_log: the port's raw Tx/Rx log as lines, Tx and Rx coloured, URCs marked, and
// the lines that arrive after it, read by calling get_log through the host (from next_offset) every half
// second while the view is visible. Text only: every byte of the port goes into the DOM as textContent.
//
// A URC (unsolicited result code) here is an Rx line where no command is pending, as AT modems define
// it: before the first Tx, or after a final result code (OK, ERROR, +CME/+CMS ERROR, NO CARRIER, BUSY,
// NO ANSWER, NO DIALTONE, CONNECT) ended the last command's answer and before the next Tx.
import "../lib/style.css";
import { byId, el, isObject, status, View, type Json } from "../lib/view";

const POLL_MS = 500;
const PAGE = 1000;       // records per get_log call (its maximum)
const MAX_LINES = 5000;  // lines kept in the page (the oldest go first)
const FINAL = /^(OK|ERROR|\+CM[ES] ERROR:.*|NO CARRIER|BUSY|NO ANSWER|NO DIALTONE|CONNECT( .*)?)$/;

interface Line { node: HTMLElement; text: HTMLElement; dir: string; open: boolean }

const statusLine = byId("status");
const consoleBox = byId("console");
const follow = byId<HTMLInputElement>("follow");
let port = "";
let logFile = "";
let next = 0;            // the next record to read
let live = false;
let paused = false;
let busy = false;
let pending = false;     // a command was sent and its final result code has not come
let last: Line | null = null;
let lines = 0;

function stamp(ts: unknown): string {
  if (typeof ts !== "number") return "";
  const d = new Date(ts * 1000);
  const two = (n: number): string => String(n).padStart(2, "0");
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}.` +
         String(d.getMilliseconds()).padStart(3, "0");
}

function newLine(dir: string, ts: unknown, index: number, label: string): Line {
  const text = el("span", "text");
  const node = el("div", `line ${dir}`, undefined, el("span", "ts", stamp(ts)), el("span", "dir", label), text);
  node.dataset.i = String(index);
  consoleBox.appendChild(node);
  lines += 1;
  while (lines > MAX_LINES && consoleBox.firstChild) { consoleBox.firstChild.remove(); lines -= 1; }
  return { node, text, dir, open: true };
}

/** A line is complete: an Rx one is a URC when no command waits for its answer; a final result code ends
 * the wait. */
function close(line: Line): void {
  line.open = false;
  const said = (line.text.textContent ?? "").trim();
  if (line.dir === "tx") { pending = true; return; }
  if (line.dir !== "rx" || !said) return;
  if (!pending) {
    line.node.classList.add("urc");
    const label = line.node.querySelector(".dir");
    if (label) label.textContent = "URC";
  }
  else if (FINAL.test(said)) pending = false;
  line.node.dataset.text = said;
}

function add(record: Json): void {
  const dir = typeof record.dir === "string" ? record.dir : "event";
  const index = typeof record.i === "number" ? record.i : -1;
  if (dir === "event") {
    if (last?.open) close(last);
    const info = isObject(record.info) ? JSON.stringify(record.info) : "";
    last = newLine("event", record.ts, index, "··");
    last.text.textContent = `${String(record.event ?? "event")} ${info}`;
    last.open = false;
    return;
  }
  const data = typeof record.data === "string" ? record.data : "";
  if (record.format === "hex") {  // not clean text: one line of its hex
    if (last?.open) close(last);
    last = newLine(dir, record.ts, index, dir === "tx" ? "Tx" : "Rx");
    last.text.textContent = `[hex] ${data}`;
    close(last);
    return;
  }
  // Text: split at line ends; an unfinished line stays open for the next chunk in the same direction.
  const parts = data.split(/\r\n|\n|\r/);
  parts.forEach((part, n) => {
    const ended = n < parts.length - 1;
    if (!part && !ended) return;
    if (!last || !last.open || last.dir !== dir) {
      if (last?.open) close(last);
      if (!part && ended && dir === "rx") return;  // the empty line between an echo and its answer
      last = newLine(dir, record.ts, index, dir === "tx" ? "Tx" : "Rx");
    }
    last.text.textContent = (last.text.textContent ?? "") + part;
    if (ended) close(last);
  });
}

function show(result: Json): void {
  const file = typeof result.log_file === "string" ? result.log_file : "";
  if (logFile && file !== logFile) {  // a new session of the port: its own log, read from its start
    if (last?.open) close(last);
    last = newLine("event", null, -1, "··");
    last.text.textContent = `new session: ${file}`;
    last.open = false;
    pending = false;
    logFile = file;
    next = 0;
    return;
  }
  logFile = file;
  port = typeof result.port === "string" ? result.port : port;
  live = result.live === true;
  const records = (Array.isArray(result.records) ? result.records : []).filter(isObject);
  const atBottom = consoleBox.scrollTop + consoleBox.clientHeight >= consoleBox.scrollHeight - 4;
  for (const record of records) add(record);
  const offset = typeof result.offset === "number" ? result.offset : next;
  next = typeof result.next_offset === "number" ? result.next_offset : offset + records.length;
  byId("summary").textContent = `${port}: ${typeof result.total_records === "number" ? result.total_records : next} ` +
    `records, ${live ? "live" : "session closed"}${paused ? ", paused" : ""}`;
  if (follow.checked && (atBottom || records.length)) consoleBox.scrollTop = consoleBox.scrollHeight;
}

async function poll(): Promise<void> {
  if (busy || paused || !port || document.visibilityState !== "visible") return;
  busy = true;
  try {
    show(await view.call("get_log", { port, offset: next, limit: PAGE }));
    status(statusLine, "");
  } catch (err) {
    status(statusLine, err instanceof Error ? err.message : String(err), true);
  } finally {
    busy = false;
  }
}

const view = new View("serial console", (result, args) => {
  consoleBox.replaceChildren();
  lines = 0;
  last = null;
  pending = false;
  logFile = "";
  port = typeof args.port === "string" ? args.port : "";
  show(result);
  status(statusLine, "");
}, (message) => status(statusLine, message, true));

byId("pause").addEventListener("click", () => {
  paused = !paused;
  byId("pause").textContent = paused ? "Resume" : "Pause";
  if (!paused) void poll();
});
setInterval(() => void poll(), POLL_MS);
document.addEventListener("visibilitychange", () => void poll());

void view.connect().catch((err: unknown) => status(statusLine, `no host: ${String(err)}`, true));
