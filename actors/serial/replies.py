"""The serial tools' replies as models: what each tool returns (its outputSchema is generated from them).

Builders (tools.py, the port actor, the record) are annotated with these, so mypy checks them; the
schemas come from actors/replies.py. Port states and packet formats are `Literal`s of the values the
code writes.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict

from diagd.actors.serial.settings import PortState

State = PortState  # a StrEnum: the reply holds its members, which JSON writes as their values
Format = Literal["text", "hex"]
WaitPolicy = Literal["keyword", "timeout", "none"]
Outcome = Literal["opened", "reconfigured", "reopened", "closed"]


class PortStatus(TypedDict):
    """One port's state, owner, settings and counters (a port diagd has not opened: its holders)."""

    port: str
    device: str | None
    state: State
    owner: str | None
    you_own: bool
    settings: NotRequired[dict[str, Any]]
    opened_at: NotRequired[str | None]
    last_rx_at: NotRequired[str | None]
    bytes_in: NotRequired[int]
    bytes_out: NotRequired[int]
    pending_urc_count: NotRequired[int]
    urc_dropped: NotRequired[int]
    urc_dropped_total: NotRequired[int]
    log_file: NotRequired[str | None]
    log_records: NotRequired[int | None]
    log_unlogged_bytes: NotRequired[int]
    last_error: NotRequired[str | None]
    holders: NotRequired[list[dict[str, Any]]]
    """processes holding a port diagd has not opened"""


class ListedPort(TypedDict):
    port: str
    description: str
    hwid: str
    label: str
    allowed: bool
    state: State


class ListPortsReply(TypedDict):
    ports: list[ListedPort]
    count: int
    added: list[str]
    """ports that appeared since your last call"""
    removed: list[str]
    first_call: bool
    baseline_from: str | None


class ConfigureReply(PortStatus):
    success: bool
    action: Literal["open", "close"]
    outcome: Outcome
    took_over_from: str | None
    discarded_urc_packets: int


class ConnectionStatusReply(TypedDict):
    ports: list[PortStatus]


class SendReply(TypedDict):
    success: bool
    """written and waited (not a good reply); false: no stop_pattern came"""
    port: str
    wait_policy: WaitPolicy
    data: str
    format: Format
    is_hex: bool
    bytes_sent: int
    bytes_received: int
    found_keyword: bool
    stop_pattern_matched: str | None
    timed_out: bool
    truncated: bool
    pending_urc_count: int
    urc_dropped: int
    elapsed_ms: float
    log_offset: int | None
    note: NotRequired[str]
    reason: NotRequired[str]
    """why success is false"""


class UrcPacket(TypedDict):
    ts: float
    data: str
    format: Format
    bytes: int
    split: bool


class ReadUrcReply(TypedDict):
    port: str
    state: State
    packets: list[UrcPacket]
    returned: int
    pending_urc_count: int
    """packets in the buffer after this call (a peek leaves them there)"""
    has_more: bool
    """packets past those returned are waiting"""
    dropped: int
    dropped_total: int


class ModemLines(TypedDict):
    cts: bool
    dsr: bool
    ri: bool
    cd: bool


class SignalsReply(TypedDict):
    success: bool
    port: str
    dtr: bool | None
    rts: bool | None
    break_ms: int | None
    modem_lines: ModemLines | None
    """null: the port has no modem lines (a pty, some USB adapters)"""


class LogRecord(TypedDict):
    """A raw log record: i, dir, ts, then the data (data, format, bytes) or the event (event, info)."""

    i: int
    dir: Literal["tx", "rx", "event"]
    ts: float | None
    data: NotRequired[str]
    format: NotRequired[Format]
    bytes: NotRequired[int]
    event: NotRequired[str | None]
    info: NotRequired[dict[str, Any]]


class LogPage(TypedDict):
    offset: int
    returned: int
    total_records: int
    next_offset: int | None
    records: list[LogRecord]


class GetLogReply(LogPage):
    port: str
    log_file: str
    live: bool


class Copied(TypedDict):
    """What an export copied from the raw log."""

    packets: int
    tx_packets: int
    rx_packets: int
    tx_bytes: int
    rx_bytes: int
    first_ts: float | None
    last_ts: float | None
    events: int
    unreadable_records: int
    log_limit_reached: bool


class Exported(Copied):
    session_started: float | None
    """the session's start, epoch seconds"""


class ExportReply(Exported):
    port: str
    session: str
    log_file: str
    live: bool
    pcapng_path: str
    """the pcapng file written (give it to the pcap tools)"""
    link_type: str
    notes: list[str]
