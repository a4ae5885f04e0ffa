"""What `diagd reload` can and cannot change in a running daemon, for its answer.

A reload swaps the config; most settings are read again by each call, so they apply to the next
one. Some are fixed into something already running: a connection, an actor's inbox, an open port,
a running execution, the children of a session. For those the reload answer
lists the setting, what it applies to, and what keeps the old value (`not_yet_applied`), rather
than letting an operator believe a new limit is in force.

Back ends say which of their own settings wait for a reopen (`Runtime.defer_on_reload`: a port keeps
the limits it was opened with, an execution those of its start) and may add notes of their own from a
reload hook (`Runtime.on_reload`); the daemon's own are listed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from diagd.actors.runtime import Deferred
from diagd.daemon.config import Config, DaemonConfig, McpConfig
from diagd.daemon.http_settings import HttpConfig

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


def static_notes(old: Config, new: Config, backends: Mapping[str, Sequence[Deferred]] | None = None
                 ) -> list[dict[str, Any]]:
    """Notes for the daemon's own settings and what the back ends declared (name -> its deferred settings)."""
    changed = set(changed_keys(old, new))
    notes = []
    tables = [("daemon", d) for d in DAEMON] + [("http", d) for d in HTTP] + [("mcp", d) for d in MCP]
    tables += [(s, d) for s, ds in (backends or {}).items() for d in ds]
    for section, deferred in tables:
        for key in deferred.keys:
            if f"[{section}] {key}" in changed:
                notes.append({"setting": f"[{section}] {key}", "applies_to": deferred.applies_to,
                              "why": deferred.why})
    return notes
