"""The capture tools' replies as models: what each tool returns (its outputSchema is generated from them).

`Capture.summary`, the back end's `describe` and interface listing, and the handlers in tools.py are
annotated with these, so mypy checks them; the schemas come from actors/replies.py.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict

Status = Literal["starting", "running", "stopped", "failed", "interrupted"]


class Drops(TypedDict):
    """Packets dropped (known once dumpcap has ended)."""

    kernel: int | None
    """dropped by the kernel, all interfaces"""
    interface: int | None
    """dropped by the interfaces (their statistics blocks)"""
    by_interface: dict[str, int] | None
    """kernel drops per interface"""
    interface_statistics: dict[str, dict[str, int]] | None
    """each interface's statistics block of the last file"""


class CaptureSummary(TypedDict):
    """One capture: its state, counters and files."""

    capture_id: str
    """the capture's id"""
    status: Status
    """starting, running, stopped, failed or interrupted"""
    running: bool
    """dumpcap runs (starting or running)"""
    stop_reason: str | None
    """why it stopped: duration, packets, bytes, requested, disk_budget, shutdown, exited, ..."""
    stopped_by: str | None
    """the client that stopped it"""
    error: str | None
    """why it failed"""
    owner: str
    """the client it belongs to"""
    owner_connected: bool | None
    """its owner is connected (null once it has ended)"""
    interfaces: list[str]
    """the interfaces captured on"""
    filter: str
    """the capture filter asked for"""
    applied_filter: str
    """the filter dumpcap runs: filter, and not the excluded ports"""
    excluded_tcp_ports: list[int]
    """never captured, whatever the filter: diagd's own MCP over HTTP port (its requests carry tokens)"""
    snaplen: int
    """bytes kept per packet"""
    ring: dict[str, Any]
    """ring_files, file_size_kb, file_duration_s: those given, and those derived from the capture's share of the
    disk budget ([capture] max_bytes): dumpcap keeps the files within it"""
    stop_on: dict[str, Any]
    """duration_s, packets, bytes (those given)"""
    packets: int
    """packets captured"""
    bytes_written: int
    """bytes of every file written (the ring drops the oldest)"""
    bytes_on_disk: int
    """bytes of the files still on disk"""
    drops: Drops
    """packets dropped"""
    files: list[str]
    """the ring's files on disk, oldest first (give one to the pcap tools as pcap_path)"""
    current_file: str | None
    """the file written now (or last)"""
    files_written: int
    """files written in all"""
    evicted: bool
    """its files were removed for the disk budget ([capture] max_bytes)"""
    dir: str
    """the capture's directory"""
    created_at: str | None
    """when it was asked for, ISO 8601 UTC"""
    started_at: str | None
    """when dumpcap started capturing"""
    ended_at: str | None
    """when it ended"""
    elapsed_s: float
    """seconds captured (so far)"""
    pid: int | None
    """dumpcap's process id"""


class StatusReply(CaptureSummary):
    """A capture's state, with what to do with its files."""

    hint: str
    """how the pcap tools read its files"""


class StopExtras(TypedDict, total=False):
    took_over_from: str | None
    """force: the owner the capture was taken from"""
    hint: str
    """how the pcap tools read its files"""


class StopReply(CaptureSummary, StopExtras):
    """The capture's state once stopped."""

    already_stopped: bool
    """it had ended before the call"""


class CapturesReply(TypedDict):
    captures: list[CaptureSummary]
    """oldest first (up to limit: the newest)"""
    total: int
    """captures matching status"""
    running: int
    """captures running now"""
    bytes_on_disk: int
    """bytes the captures' files and their views hold (what max_bytes bounds)"""
    max_bytes: int
    """[capture] max_bytes, the disk budget"""
    max_concurrent: int
    """[capture] max_concurrent"""


class LinkType(TypedDict):
    dlt: int
    """the link type's number (DLT)"""
    name: str
    """its name"""
    description: str
    """what it is"""


class ListedInterface(TypedDict):
    """An interface as dumpcap lists it (`dumpcap -D -M`)."""

    name: str
    """give it to start_capture"""
    description: str
    """its friendly name or vendor"""
    type: str
    """wired, wireless, loopback, virtual, ..."""
    addresses: list[str]
    """its addresses"""
    loopback: bool
    """it is a loopback interface"""


class KernelState(TypedDict):
    """An interface's state as the kernel has it (/sys/class/net)."""

    up: bool | None
    """administratively up (null: not a kernel interface)"""
    running: bool | None
    """it has a link (carrier)"""
    operstate: str | None
    """the kernel's operstate"""


class LinkTypes(TypedDict, total=False):
    """An interface's link types (`dumpcap -L -M`), when they were asked for."""

    monitor_mode: bool
    """monitor mode is possible"""
    link_types: list[LinkType]
    """the link types dumpcap can capture it as"""
    link_types_error: str
    """why its link types could not be listed"""


class InterfaceInfo(ListedInterface, KernelState, LinkTypes):
    """An interface dumpcap can capture on."""

    allowed: bool
    """[capture] allowed_interfaces allows it"""


class InterfacesReply(TypedDict):
    interfaces: list[InterfaceInfo]
    """the interfaces (allowed_only: the allowed ones)"""
    count: int
    """interfaces listed"""
    capture_enabled: bool
    """[capture] allowed_interfaces is set"""
    allowed_interfaces: list[str]
    """[capture] allowed_interfaces (names and patterns)"""


class RecordingReply(TypedDict):
    """A recording: its parts' ids, under one recording_id."""

    recording_id: str
    """name it in diagd_record_stop"""
    status: str
    """recording, stopping or stopped"""
    owner: NotRequired[str]
    """the client it belongs to"""
    capture_id: NotRequired[str | None]
    """its live capture"""
    pcap_path: NotRequired[str | None]
    """capture:<recording_id>: its capture, for the pcap tools"""
    ports: NotRequired[list[str]]
    """its serial ports"""
    execution_id: NotRequired[str | None]
    """its bpftrace execution"""
    started_at: NotRequired[float | None]
    """when its parts had started, epoch seconds"""
    stopped_at: NotRequired[float | None]
    """when it was stopped"""
    hint: NotRequired[str]
    """what to do next"""


class BundleParts(TypedDict, total=False):
    capture: dict[str, Any]
    """its capture: id, status, stop reason, packets, drops, pcap_path"""
    serial: list[Any]
    """each serial session, exported as pcapng"""
    bpftrace: dict[str, Any]
    """its bpftrace execution's status and output"""
    timeline: dict[str, Any]
    """its parts' rows merged by time (diagd_timeline)"""
    already_stopped: bool
    """it had been stopped before this call (the stored bundle)"""


class BundleReply(RecordingReply, BundleParts):
    """A stopped recording's bundle (bundle.json in its directory keeps more rows)."""
