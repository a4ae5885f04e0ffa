"""The daemon's own tools' replies as models: what each returns (its outputSchema is generated from them).

The daemon's status and reload, the call records and the timeline merge are annotated with these,
so mypy checks them; the schemas come from actors/replies.py.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict


class DaemonInfo(TypedDict):
    """The daemon process."""

    pid: int
    """its process id"""
    version: str
    """diagd's version"""
    uptime_s: float
    """seconds since it started"""
    started_at: str
    """its start, ISO 8601 UTC"""
    sockets: dict[str, str]
    """the sockets it listens on, by kind"""
    sockets_from_systemd: list[str]
    """the kinds whose socket systemd passed (socket activation)"""
    config: str
    """the config file in force (or <defaults>)"""
    state_dir: str
    """where it keeps its state"""
    clients: list[Any]
    """the connected clients"""
    connections_dropped: int
    """idle connections dropped to admit new ones"""
    connections_refused: int
    """connections refused (the table was full of busy ones)"""
    calls_total: int
    """tool calls since the start"""
    rss_bytes: int | None
    """this process's resident memory (its workers not counted)"""
    workers: int
    """worker processes of the actors"""
    workers_rss_bytes: int
    """the workers' resident memory"""
    heap_trims: int
    """times the heap was given back to the system"""
    warnings: list[str]
    """what is unsafe about how this daemon runs"""


class StatusReply(TypedDict):
    """Daemon, actors and per-tool statistics (of the client's tool groups)."""

    daemon: DaemonInfo
    """the daemon process"""
    actors: list[dict[str, Any]]
    """each actor: id, kind, group, state, inbox, idle time, restarts, details"""
    tools: dict[str, dict[str, Any]]
    """per tool: calls, errors, durations"""
    backends: dict[str, dict[str, list[dict[str, Any]]]]
    """per back end, what it keeps beyond its actors (a capture's index on disk), as tables of rows"""


class CallInfo(TypedDict):
    """One call, as the audit log and diagd_calls show it."""

    ts: float
    """when it started, epoch seconds"""
    client: str
    """the client that made it"""
    tool: str
    """the tool called"""
    arguments: dict[str, Any]
    """its arguments (another client's: redacted unless the config says otherwise)"""
    duration_ms: float
    """how long it took (so far, while running)"""
    queue_ms: float
    """time its requests waited in actor inboxes"""
    outcome: str
    """started, running, ok, error or cancelled"""
    code: str | None
    """the error code of a failed call"""
    bytes: int
    """the reply's size"""
    truncated: bool
    """the reply was cut to the reply limit"""
    call_id: NotRequired[str]
    """the id shared by a call's start and end records"""
    details: NotRequired[dict[str, Any]]
    """a refused call's JSON-RPC code and did_you_mean"""


class CallsReply(TypedDict):
    calls: list[CallInfo]
    """newest first (running calls on top)"""
    returned: int
    """calls in this reply"""
    total_calls: int
    """calls since the daemon started"""


class StopActorReply(TypedDict):
    stopped: str
    """the actor's id"""
    kind: str
    """its kind"""
    resource: str
    """the resource it held"""


class ReloadReply(TypedDict):
    reloaded: Literal[True]
    """the new config is in force"""
    config: str
    """the config file read"""
    actors_retimed: list[str]
    """actors whose idle timeout changed"""
    changed: list[str]
    """every changed setting, '[table] key'"""
    not_yet_applied: list[dict[str, Any]]
    """changed settings that wait for a reopen or a restart, and why"""


class Span(TypedDict):
    first: str
    """the first merged row's time, ISO 8601 UTC"""
    last: str
    """the last merged row's time"""


class SourceSummary(TypedDict):
    """What one source gave."""

    source: str
    """its label"""
    kind: str
    """its kind"""
    rows: int
    """rows it gave"""
    offset_ms: float
    """the offset added to its times"""
    cut: bool
    """it had more rows than one call reads"""
    cut_at: NotRequired[float | None]
    """its last row's time, when cut"""
    why: NotRequired[str]
    """why it was cut"""
    steps_back: NotRequired[int]
    """rows stamped earlier than the row before them in this source (kept in the source's order, not moved)"""
    note: NotRequired[str]
    """what its kind says about it (e.g. no row in the window)"""


class TimelineReply(TypedDict):
    """The sources' rows merged by wall-clock time."""

    rows: list[dict[str, Any]]
    """t (epoch s, offset applied), time (ISO), source, then the source's own fields"""
    returned: int
    """rows in this page"""
    total: int
    """merged rows"""
    offset: int
    """the first row of this page"""
    next_offset: int | None
    """offset of the next page (null: the end)"""
    span: Span | None
    """the merged rows' first and last times (null: no row)"""
    sources: list[SourceSummary]
    """each source, in the order given"""
    complete_until: NotRequired[float]
    """a source was cut: rows are complete up to this t"""
    hint: NotRequired[str]
    """what to do next"""
