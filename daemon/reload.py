"""What `diagd reload` can and cannot change in a running daemon, for its answer.

A reload swaps the config; most settings are read again by each call, so they apply to the next
one. Some are fixed into something already running: a connection, an actor's inbox, an open serial
port, a running bpftrace execution, the children of a crash session. For those the reload answer
lists the setting, what it applies to, and what keeps the old value (`not_yet_applied`), rather
than letting an operator believe a new limit is in force.

Back ends may describe their own through `Runtime.on_reload` (crash does); serial, bpftrace and
pcap register hooks that only check their table (a reload with an error is refused whole, see
config_check.py). The table below holds their notes, read from their code (serial:
`PortRecord.config` is the config at open, the line settings too; bpftrace: an `Execution` keeps
the settings of its `exec_program`); pcap re-reads everything per call and needs no entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagd.daemon.config import Config, DaemonConfig, McpConfig
from diagd.daemon.http_settings import HttpConfig


@dataclass(frozen=True)
class Deferred:
    keys: tuple[str, ...]
    applies_to: str
    why: str


DAEMON: tuple[Deferred, ...] = (
    Deferred(("extra_backends",), "the next daemon start", "back-end modules are imported once, at start"),
    Deferred(("control_buffer_bytes",), "the next daemon start", "the shared frame budget is sized at start"),
    Deferred(("max_line_bytes", "frame_timeout_s"), "MCP connections made after the reload",
             "an MCP connection's line reader is set up when it connects (a shim keeps its connection)"),
    Deferred(("inbox_size",), "actors started after the reload", "an actor's inbox is allocated when it starts"),
)

HTTP: tuple[Deferred, ...] = (
    Deferred(tuple(HttpConfig.__dataclass_fields__), "the next daemon start",
             "the HTTP listener (address, TLS, Host checks) is set up once, at start"),
)

MCP: tuple[Deferred, ...] = (
    Deferred(("tools",), "MCP sessions opened after the reload (stdio connections and HTTP sessions alike)",
             "a session's tool list is fixed for its life (listChanged: false, no notification): live "
             "sessions keep theirs; 2026-07-28 requests over HTTP, which have no session, see it at once"),
)

BACKENDS: dict[str, tuple[Deferred, ...]] = {
    "serial": (Deferred(("max_reply_bytes", "urc_max_packets", "urc_max_bytes", "write_timeout_ms", "log_max_bytes",
                         "log_keep"),
                        "ports opened after the reload (configure_connection action=close, then open)",
                        "an open port keeps the [serial] limits it was opened with"),
               Deferred(("baudrate", "idle_ms", "line_ending", "ports"),
                        "ports opened after the reload (or configure_connection with the new value)",
                        "an open port keeps the line settings it was opened or configured with"),),
    "bpftrace": (Deferred(("path", "privileged_helper", "allow_unsafe", "max_lines", "max_output_bytes",
                           "stop_grace_s", "stop_s_per_probe", "start_timeout_s", "linger_s"),
                          "executions started after the reload",
                          "a running execution keeps the command line and limits of its exec_program"),),
}


def changed_keys(old: Config, new: Config) -> list[str]:
    """Every setting whose value differs, as "[section] key"."""
    out = [f"[daemon] {k}" for k in DaemonConfig.__dataclass_fields__
           if getattr(old.daemon, k) != getattr(new.daemon, k)]
    out += [f"[http] {k}" for k in HttpConfig.__dataclass_fields__ if getattr(old.http, k) != getattr(new.http, k)]
    out += [f"[mcp] {k}" for k in McpConfig.__dataclass_fields__ if getattr(old.mcp, k) != getattr(new.mcp, k)]
    for section in sorted(set(old.backends) | set(new.backends)):
        before, after = old.backend(section), new.backend(section)
        out += [f"[{section}] {k}" for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    return out


def static_notes(old: Config, new: Config) -> list[dict[str, Any]]:
    """Notes for the daemon's own settings and the back ends described in `BACKENDS`."""
    changed = set(changed_keys(old, new))
    notes = []
    tables = [("daemon", d) for d in DAEMON] + [("http", d) for d in HTTP] + [("mcp", d) for d in MCP]
    tables += [(s, d) for s, ds in BACKENDS.items() for d in ds]
    for section, deferred in tables:
        for key in deferred.keys:
            if f"[{section}] {key}" in changed:
                notes.append({"setting": f"[{section}] {key}", "applies_to": deferred.applies_to,
                              "why": deferred.why})
    return notes
