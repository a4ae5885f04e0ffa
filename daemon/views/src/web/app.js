// diagd's web view (/ui): the calls as they happen (Server-Sent Events from /ui/api/events) and what
// `diagd status` shows (/ui/api/status, polled). Everything that comes from the daemon (tool arguments
// hold what a packet, a log, a device or an agent said) goes into the page as text: elements are made
// with createElement and filled with textContent, never parsed as markup (no innerHTML anywhere).
// A call of a tool with a view (a packet list, a ladder, graphs, a serial console) gets a "view" button:
// the daemon runs that call again for this page (POST /ui/api/call with its call_id) and host.js shows
// the tool's view of the answer in a sandboxed frame, as an MCP Apps host would.
"use strict";

const MAX_ROWS = 500;
const STATUS_EVERY_MS = 2000;
const rows = new Map(); // call_id -> <tr>
let boot = null;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function clock(ts) {
  const d = new Date(ts * 1000);
  return d.toLocaleTimeString(undefined, { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function ms(value) {
  if (value === null || value === undefined) return "-";
  return value < 1000 ? value.toFixed(1) + " ms" : (value / 1000).toFixed(2) + " s";
}

function compact(value) {
  try {
    return JSON.stringify(value);
  } catch (e) {
    return String(value);
  }
}

function fillCall(tr, record) {
  clear(tr);
  const running = record.outcome === "started";
  tr.className = running ? "started" : record.outcome;
  tr.dataset.callId = record.call_id || "";
  tr.dataset.tool = record.tool;
  tr.dataset.outcome = record.outcome;
  tr.append(
    el("td", clock(record.ts), "time"),
    el("td", record.client, "client"),
    el("td", record.tool, "tool"),
    el("td", compact(record.arguments), "args"),
    el("td", running ? "running…" : ms(record.duration_ms), "num duration"),
    el("td", running ? "running" : record.outcome + (record.code ? " " + record.code : ""), "outcome"),
    viewCell(record),
  );
}

function viewCell(record) {
  const cell = el("td", undefined, "view");
  if (record.view && record.outcome === "ok" && window.diagdWebHost) {
    const button = el("button", "view");
    button.type = "button";
    button.title = "show " + record.tool + "'s view of this call (the call runs again)";
    button.addEventListener("click", () => openView(record));
    cell.append(button);
  }
  return cell;
}

function viewStatus(text) {
  document.getElementById("view-status").textContent = text;
}

async function openView(record) {
  const section = document.getElementById("view-section");
  section.hidden = false;
  viewStatus("running " + record.tool + " again…");
  try {
    const answer = await fetch("/ui/api/call", {
      method: "POST", credentials: "same-origin", cache: "no-store",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ call_id: record.call_id }),
    });
    if (!answer.ok) {
      viewStatus(record.tool + ": " + answer.status + " " + (await answer.text()).slice(0, 300));
      return;
    }
    const again = await answer.json();
    await window.diagdWebHost.show({
      holder: document.getElementById("view-holder"), view: record.view, toolName: again.tool,
      args: again.arguments, result: again.result, onStatus: viewStatus,
    });
  } catch (e) {
    viewStatus(record.tool + ": " + String(e));
  }
}

function closeView() {
  document.getElementById("view-section").hidden = true;
  document.getElementById("view-holder").replaceChildren();
  viewStatus("");
}

function addCall(record) {
  const body = document.querySelector("#calls tbody");
  const key = record.call_id || "seq-" + record.seq;
  let tr = rows.get(key);
  if (!tr) {
    tr = document.createElement("tr");
    rows.set(key, tr);
    body.insertBefore(tr, body.firstChild); // newest first
    while (rows.size > MAX_ROWS) {
      const [oldest, row] = rows.entries().next().value;
      row.remove();
      rows.delete(oldest);
    }
  }
  fillCall(tr, record);
  document.getElementById("call-count").textContent = "(" + rows.size + " shown)";
}

function resetCalls() {
  rows.clear();
  clear(document.querySelector("#calls tbody"));
}

function live(on) {
  const badge = document.getElementById("live");
  badge.textContent = on ? "live" : "reconnecting";
  badge.className = "badge " + (on ? "on" : "off");
}

function listen() {
  const events = new EventSource("/ui/api/events");
  events.addEventListener("hello", (event) => {
    const hello = JSON.parse(event.data);
    if (boot !== hello.boot || !hello.resumed) resetCalls(); // a new daemon, or a stream from the start
    boot = hello.boot;
    live(true);
  });
  events.onmessage = (event) => addCall(JSON.parse(event.data));
  events.onerror = () => live(false); // EventSource reconnects by itself, with Last-Event-ID
}

function fillActors(actors) {
  const body = document.querySelector("#actors tbody");
  clear(body);
  for (const a of actors) {
    const tr = document.createElement("tr");
    tr.dataset.actorId = a.id;
    const idle = a.idle_s_left === null ? "-" : a.idle_s_left.toFixed(0) + " s";
    tr.append(
      el("td", a.id), el("td", a.kind), el("td", a.resource), el("td", a.state),
      el("td", a.inbox_depth, "num"), el("td", idle, "num"), el("td", a.restarts, "num"),
      el("td", a.current_op || (a.last_error ? "last error: " + a.last_error : "")),
      el("td", compact(a.details), "details"),
    );
    body.append(tr);
  }
  document.getElementById("actor-count").textContent = "(" + actors.length + ")";
}

function fillDaemon(d) {
  document.getElementById("daemon").textContent =
    "diagd " + d.version + ", pid " + d.pid + ", up " + Math.round(d.uptime_s) + " s, " + d.calls_total + " calls";
  const facts = document.getElementById("facts");
  clear(facts);
  const clients = d.clients.map((c) => c.kind + ":" + c.pid + " " + (c.state || "?")).join(", ") || "none";
  const mb = (n) => (n === null || n === undefined ? "-" : (n / 1048576).toFixed(1) + " MB");
  const shown = [
    ["sockets", Object.entries(d.sockets).map(([k, v]) => k + "=" + v).join("  ")],
    ["clients", clients],
    ["memory", "daemon " + mb(d.rss_bytes) + ", " + d.workers + " workers " + mb(d.workers_rss_bytes)],
    ["config", d.config],
    ["state", d.state_dir],
    ["started", d.started_at],
  ];
  for (const [name, value] of shown) facts.append(el("dt", name), el("dd", value));
  const warnings = document.getElementById("warnings");
  clear(warnings);
  for (const w of d.warnings || []) warnings.append(el("li", w));
}

async function poll() {
  try {
    const answer = await fetch("/ui/api/status", { credentials: "same-origin", cache: "no-store" });
    if (answer.ok) {
      const status = await answer.json();
      fillDaemon(status.daemon);
      fillActors(status.actors);
    } else if (answer.status === 401) {
      document.getElementById("daemon").textContent = "logged out: run `diagd ui` for a new login link";
    }
  } catch (e) {
    live(false);
  }
  setTimeout(poll, STATUS_EVERY_MS);
}

document.getElementById("view-close").addEventListener("click", closeView);
listen();
poll();
