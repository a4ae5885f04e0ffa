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
    """the port (its path, or a name configured in [serial])"""
    device: str | None
    """the device node it resolves to"""
    state: State
    """the port's state"""
    owner: str | None
    """the client that owns it"""
    you_own: bool
    """you are its owner"""
    settings: NotRequired[dict[str, Any]]
    """baud rate, framing, line ending, flow control, ... in force"""
    opened_at: NotRequired[str | None]
    """when it was opened, ISO 8601 UTC"""
    last_rx_at: NotRequired[str | None]
    """when it last received, ISO 8601 UTC"""
    bytes_in: NotRequired[int]
    """bytes received this session"""
    bytes_out: NotRequired[int]
    """bytes sent this session"""
    pending_urc_count: NotRequired[int]
    """unsolicited packets buffered (read_urc reads them)"""
    urc_dropped: NotRequired[int]
    """unsolicited packets dropped since your last read (the buffer was full)"""
    urc_dropped_total: NotRequired[int]
    """unsolicited packets dropped this session"""
    log_file: NotRequired[str | None]
    """the session's raw Tx/Rx log"""
    log_records: NotRequired[int | None]
    """records in the raw log"""
    log_unlogged_bytes: NotRequired[int]
    """bytes past the log size cap, not logged"""
    last_error: NotRequired[str | None]
    """the last I/O error"""
    holders: NotRequired[list[dict[str, Any]]]
    """processes holding a port diagd has not opened"""


class ListedPort(TypedDict):
    port: str
    """the port"""
    description: str
    """what the system says it is"""
    hwid: str
    """its hardware id (USB VID:PID, serial number)"""
    label: str
    """port - description"""
    allowed: bool
    """configure_connection may open it: [serial] allowed_ports allows it (a pty only if named there)"""
    state: State
    """its state in diagd"""


class ListPortsReply(TypedDict):
    ports: list[ListedPort]
    """the ports, by name"""
    count: int
    """ports listed"""
    added: list[str]
    """ports that appeared since your last call"""
    removed: list[str]
    """ports that went away since your last call"""
    first_call: bool
    """your first call (added and removed are empty)"""
    baseline_from: str | None
    """when the listing added and removed compare with was taken"""


class ConfigureReply(PortStatus):
    success: bool
    """the action was done"""
    action: Literal["open", "close"]
    """open or close"""
    outcome: Outcome
    """opened, reconfigured, reopened or closed"""
    took_over_from: str | None
    """force: the owner it was taken from"""
    discarded_urc_packets: int
    """close: unsolicited packets left unread"""


class ConnectionStatusReply(TypedDict):
    ports: list[PortStatus]
    """each port's status (the one asked, or every one open in diagd)"""


class SendReply(TypedDict):
    success: bool
    """written and waited (not a good reply); false: no stop_pattern came"""
    port: str
    """the port"""
    wait_policy: WaitPolicy
    """what ended the wait: keyword, timeout or none"""
    data: str
    """the reply (text, or hex)"""
    format: Format
    """text or hex"""
    is_hex: bool
    """data is hex"""
    bytes_sent: int
    """bytes written"""
    bytes_received: int
    """bytes of the reply"""
    found_keyword: bool
    """a stop_pattern came"""
    stop_pattern_matched: str | None
    """the stop_pattern that came"""
    timed_out: bool
    """the wait ended at timeout_ms"""
    truncated: bool
    """the reply was cut at its size cap"""
    pending_urc_count: int
    """unsolicited packets buffered"""
    urc_dropped: int
    """unsolicited packets dropped since your last read"""
    elapsed_ms: float
    """time from the write to the end of the wait"""
    log_offset: int | None
    """the write's record in the raw log (get_log offset)"""
    note: NotRequired[str]
    """what to know about the reply"""
    reason: NotRequired[str]
    """why success is false"""


class UrcPacket(TypedDict):
    ts: float
    """when it arrived, epoch seconds"""
    data: str
    """its bytes (text, or hex)"""
    format: Format
    """text or hex"""
    bytes: int
    """its size"""
    split: bool
    """cut at the size cap: the next packet continues it"""


class ReadUrcReply(TypedDict):
    port: str
    """the port"""
    state: State
    """the port's state"""
    packets: list[UrcPacket]
    """oldest first"""
    returned: int
    """packets returned"""
    pending_urc_count: int
    """packets in the buffer after this call (a peek leaves them there)"""
    has_more: bool
    """packets past those returned are waiting"""
    dropped: int
    """packets dropped since your last read"""
    dropped_total: int
    """packets dropped this session"""


class ModemLines(TypedDict):
    cts: bool
    """clear to send"""
    dsr: bool
    """data set ready"""
    ri: bool
    """ring indicator"""
    cd: bool
    """carrier detect"""


class SignalsReply(TypedDict):
    success: bool
    """the lines were set"""
    port: str
    """the port"""
    dtr: bool | None
    """DTR as set (null: unchanged)"""
    rts: bool | None
    """RTS as set (null: unchanged)"""
    break_ms: int | None
    """the break sent (null: none)"""
    modem_lines: ModemLines | None
    """null: the port has no modem lines (a pty, some USB adapters)"""


class LogRecord(TypedDict):
    """A raw log record: i, dir, ts, then the data (data, format, bytes) or the event (event, info)."""

    i: int
    """its index in the log"""
    dir: Literal["tx", "rx", "event"]
    """tx, rx or event"""
    ts: float | None
    """when, epoch seconds"""
    data: NotRequired[str]
    """tx/rx: the bytes (text, or hex)"""
    format: NotRequired[Format]
    """text or hex"""
    bytes: NotRequired[int]
    """tx/rx: their count"""
    event: NotRequired[str | None]
    """event: which (opened, closed, log_limit, ...)"""
    info: NotRequired[dict[str, Any]]
    """event: its details"""


class LogPage(TypedDict):
    offset: int
    """the first record of this page"""
    returned: int
    """records in this page"""
    total_records: int
    """records in the log"""
    next_offset: int | None
    """offset of the next page (null: the end)"""
    records: list[LogRecord]
    """the records"""


class GetLogReply(LogPage):
    port: str
    """the port"""
    log_file: str
    """the raw log read"""
    live: bool
    """the session is still open (the log grows)"""


class Copied(TypedDict):
    """What an export copied from the raw log."""

    packets: int
    """packets written (one per Tx/Rx chunk)"""
    tx_packets: int
    """Tx packets"""
    rx_packets: int
    """Rx packets"""
    tx_bytes: int
    """bytes sent"""
    rx_bytes: int
    """bytes received"""
    first_ts: float | None
    """the first packet's time, epoch seconds"""
    last_ts: float | None
    """the last packet's time"""
    events: int
    """event records (not written as packets)"""
    unreadable_records: int
    """log records that could not be read (skipped)"""
    log_limit_reached: bool
    """the raw log had reached its size cap (later bytes are not in it)"""


class Exported(Copied):
    session_started: float | None
    """the session's start, epoch seconds"""


class ExportReply(Exported):
    port: str
    """the port"""
    session: str
    """the session's log name"""
    log_file: str
    """the raw log read"""
    live: bool
    """the session is still open"""
    pcapng_path: str
    """the pcapng file written (give it to the pcap tools)"""
    link_type: str
    """the pcapng's link type"""
    notes: list[str]
    """what to know about the export"""
