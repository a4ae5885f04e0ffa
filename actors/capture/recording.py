"""A recorded reproduction: a live capture, serial sessions on named ports and a bpftrace program started
together under one id (each part optional), stopped together into one bundle: the capture's pcapng, each
serial session as pcapng, the bpftrace output and the merged timeline.

It composes the other groups' tools by name through `Runtime.call`, as the calling client (its tool
groups, its ownership of ports and captures, every tool's limits hold), never their packages. `USES`
declares each tool it calls with the arguments it passes (record_tools.register): the daemon checks them
against those tools at start (a renamed one stops the start) and refuses a call they do not cover. A part
whose group the client has not selected fails as that tool would. A start that fails half-way stops the
parts already started. The record is `<state>/capture/recordings/<id>.json`; the bundle's own files
(the bpftrace output, bundle.json) are `<state>/capture/exports/<id>/`, beside the capture's. The
capture reads as `capture:<recording id>` too (views.py), so the one id reaches every pcap tool.

Who sees a recording (its stop, its bundle, `capture:<recording id>`): a client whose tool groups hold
every group its parts are read with (`groups_for`: the capture and its frames, serial, bpftrace), and
that is its owner (the client that started it), or, once the owner has gone (as a port or a capture is
taken over, backend.owner_connected), a client of the same user. Anyone else is told there is no such
recording (NOT_FOUND, as for an id never made): ids are not disclosed. A client starts only a recording
it could see (PERMISSION_DENIED naming the groups it lacks), so it can always stop what it started.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors import statefile
from diagd.actors._paths import made_stem
from diagd.actors.capture.replies import BundleParts, BundleReply, RecordingReply
from diagd.actors.runtime import DAEMON_GROUP, ToolUse
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.capture.recording")

RECORDING_ID = re.compile(r"^rec-[0-9a-f]{8}$")
Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
ROLLBACK_S = 60.0
TIMELINE_ROWS = 2000  # merged rows kept in bundle.json (diagd_timeline's page maximum)
BPFTRACE_LINES = 10000  # get_result's page maximum

# The groups a part is read with, besides the recording tools' own (the capture group): a capture's
# frames through the pcap tools (the bundle's timeline, `capture:<recording id>`), a serial session
# through the serial tools (export_serial_pcapng, get_log), a program's output through bpftrace's.
CAPTURE_GROUP, PCAP_GROUP, SERIAL_GROUP, BPFTRACE_GROUP = "capture", "pcap", "serial", "bpftrace"
# Every tool a recording calls, of which group, with the argument names this module passes it; `forwards`: the
# client's own arguments for it (diagd_record_start's capture, bpftrace, serial_settings) go through too.
USES = (
    ToolUse(CAPTURE_GROUP, "start_capture", forwards=True),
    ToolUse(CAPTURE_GROUP, "stop_capture", ("capture_id",)),
    ToolUse(BPFTRACE_GROUP, "exec_program", forwards=True),
    ToolUse(BPFTRACE_GROUP, "stop_execution", ("execution_id",)),
    ToolUse(BPFTRACE_GROUP, "get_result", ("execution_id", "until", "wait_s", "limit")),
    ToolUse(SERIAL_GROUP, "configure_connection", ("port", "action"), forwards=True),
    ToolUse(SERIAL_GROUP, "export_serial_pcapng", ("port", "name")),
    ToolUse(DAEMON_GROUP, "diagd_timeline", ("sources", "start", "end", "limit")),
)
# A selection of tool groups, as tooling.current_groups holds it: None is every group.
Groups = frozenset[str] | None


def groups_for(*, capture: bool, serial: bool, bpftrace: bool) -> frozenset[str]:
    """The tool groups a client needs to stop a recording of these parts and read its bundle."""
    return frozenset({CAPTURE_GROUP, *((PCAP_GROUP,) if capture else ()), *((SERIAL_GROUP,) if serial else ()),
                      *((BPFTRACE_GROUP,) if bpftrace else ())})


def user_of(client: str) -> str:
    """The user a client acts for: an HTTP client's token (`http:<name>`); every client of the local sockets
    (`mcp:<pid>`, `cli:<pid>`) is the daemon's own user, the only one they admit (SO_PEERCRED)."""
    return client if client.startswith("http:") else "local"


@dataclass
class Recording:
    id: str
    owner: str
    dir: str
    created_at: float = field(default_factory=time.time)
    status: str = "recording"  # recording, stopping, stopped
    capture_id: str | None = None
    ports: list[str] = field(default_factory=list)
    opened_ports: list[str] = field(default_factory=list)  # opened by the recording: closed at its stop
    execution_id: str | None = None
    started_at: float | None = None
    stopped_at: float | None = None
    bundle: BundleReply | None = None

    def groups(self) -> frozenset[str]:
        """The tool groups its parts are read with (groups_for)."""
        return groups_for(capture=self.capture_id is not None, serial=bool(self.ports),
                          bpftrace=self.execution_id is not None)

    def visible_to(self, client: str, groups: Groups, owner_connected: bool) -> bool:
        """Whether `client` (of these tool groups) may stop it and read its bundle: see the module docstring."""
        if groups is not None and not self.groups() <= groups:
            return False
        return client == self.owner or (not owner_connected and user_of(client) == user_of(self.owner))

    def summary(self) -> RecordingReply:
        return {"recording_id": self.id, "status": self.status, "owner": self.owner,
                "capture_id": self.capture_id, "pcap_path": f"capture:{self.id}" if self.capture_id else None,
                "ports": self.ports, "execution_id": self.execution_id, "started_at": self.started_at,
                "stopped_at": self.stopped_at}


class RecordingStore:
    def __init__(self, state_dir: Path) -> None:
        self.meta_dir = state_dir / "recordings"
        self.data_dir = state_dir / "exports"

    def path(self, recording_id: str) -> Path:
        if not RECORDING_ID.fullmatch(recording_id):  # fullmatch: `$` alone passes a trailing newline
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"not a recording id: {recording_id!r}",
                             hint="recording ids look like rec-1a2b3c4d (diagd_record_start)")
        return self.meta_dir / f"{recording_id}.json"

    def new(self, owner: str) -> Recording:
        statefile.ensure_dir(self.meta_dir)
        statefile.ensure_dir(self.data_dir)
        while True:
            rid = f"rec-{secrets.token_hex(4)}"
            if not self.path(rid).exists() and not (self.data_dir / rid).exists():
                break
        return Recording(id=rid, owner=owner, dir=str(statefile.ensure_dir(self.data_dir / rid)))

    def save(self, rec: Recording) -> None:
        path = self.path(rec.id)
        tmp = path.with_name(path.name + ".tmp")
        with open(statefile.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
            json.dump(asdict(rec), f)
        os.replace(tmp, path)

    def load(self, recording_id: str) -> Recording:
        try:
            data = json.loads(statefile.read_text(self.path(recording_id)))
        except FileNotFoundError:
            raise not_found(recording_id) from None
        names = set(Recording.__dataclass_fields__)
        return Recording(**{k: v for k, v in data.items() if k in names})

    def forget(self, rec: Recording) -> None:
        shutil.rmtree(rec.dir, ignore_errors=True)
        self.path(rec.id).unlink(missing_ok=True)

    def prune(self, keep: int) -> list[str]:
        """Keep the newest `keep` stopped recordings (their bundles and records); the older ones go."""
        found = []
        for path in self.meta_dir.glob("rec-*.json") if self.meta_dir.is_dir() else ():
            try:
                found.append(self.load(path.stem))
            except (DiagdError, ValueError, TypeError):
                continue
        stopped = sorted((r for r in found if r.status == "stopped"), key=lambda r: r.created_at)
        gone = stopped[:max(0, len(stopped) - keep)]
        for rec in gone:
            self.forget(rec)
        return [r.id for r in gone]

    def write(self, rec: Recording, name: str, text: str) -> str:
        path = Path(rec.dir) / name
        with open(statefile.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
            f.write(text)
        return str(path)


def not_found(recording_id: str) -> DiagdError:
    """The answer for an id never made, and for a recording the caller may not see (the same words)."""
    return DiagdError(ErrorCode.NOT_FOUND, f"no recording {recording_id!r}",
                      hint="diagd_record_start returns the recording_id (a recording is seen by its owner)")


def check_groups(args: dict[str, Any], groups: Groups) -> None:
    """A client starts only a recording it could stop and read: PERMISSION_DENIED naming the groups its parts
    are read with that it has not selected."""
    if groups is None:  # every group
        return
    needed = groups_for(capture="capture" in args, serial=bool(args.get("serial_ports")), bpftrace="bpftrace" in args)
    missing = sorted(needed - groups)
    if missing:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"this recording is read with the tool groups "
                         f"{', '.join(sorted(needed))}; this client has not selected {', '.join(missing)}, so it "
                         "could not stop it nor read its bundle", needed=sorted(needed), missing=missing,
                         selected=sorted(groups),
                         hint=f"select them too (diagd mcp --tools {','.join(sorted((groups | needed) - {'diagd'}))})")


async def start(call: Call, store: RecordingStore, owner: str, args: dict[str, Any], *, keep: int,
                groups: Groups = None) -> Recording:
    """Start the parts asked for, capture first (it answers once dumpcap writes), then the program (once its
    probes attach), then the ports; a failure stops what had started, leaves no record and is raised as
    itself. The newest `keep` stopped recordings are kept. `groups`: the client's (check_groups)."""
    if not any(args.get(k) for k in ("capture", "serial_ports", "bpftrace")):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "a recording needs at least one of capture, serial_ports, "
                         "bpftrace")
    check_groups(args, groups)
    await trio.to_thread.run_sync(store.prune, keep)
    rec = await trio.to_thread.run_sync(store.new, owner)

    async def part(name: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        try:
            return await call(tool, arguments)
        except DiagdError as exc:  # say which part (its argument paths are its tool's: "$.interfaces")
            raise DiagdError(exc.code, f"{name} ({tool}): {exc.message}", **{**exc.details, "part": name}) from None

    try:
        if "capture" in args:
            rec.capture_id = (await part("capture", "start_capture", args["capture"]))["capture_id"]
        if "bpftrace" in args:
            rec.execution_id = (await part("bpftrace", "exec_program", args["bpftrace"]))["execution_id"]
        for port in args.get("serial_ports", []):
            opened = await part("serial_ports", "configure_connection",
                                {"port": port, **args.get("serial_settings", {})})
            rec.ports.append(opened["port"])
            if opened["outcome"] == "opened":
                rec.opened_ports.append(opened["port"])
    except BaseException:
        with trio.CancelScope(shield=True), trio.move_on_after(ROLLBACK_S):
            await _stop_parts(call, rec, quiet=True)
            await trio.to_thread.run_sync(store.forget, rec)
        raise
    rec.started_at = time.time()
    await trio.to_thread.run_sync(store.save, rec)
    log.info("recording started", **rec.summary())
    return rec


async def _stop_parts(call: Call, rec: Recording, *, quiet: bool) -> dict[str, Any]:
    stopped: dict[str, Any] = {}

    async def one(key: str, tool: str, arguments: dict[str, Any]) -> None:
        try:
            stopped[key] = await call(tool, arguments)
        except DiagdError as exc:
            if not quiet:
                raise
            log.warning("a recording's part did not stop", recording_id=rec.id, tool=tool, error=exc.message)

    if rec.capture_id:
        await one("capture", "stop_capture", {"capture_id": rec.capture_id})
    if rec.execution_id:
        await one("bpftrace", "stop_execution", {"execution_id": rec.execution_id})
    if quiet:
        for port in rec.opened_ports:
            await one(f"close:{port}", "configure_connection", {"port": port, "action": "close"})
    return stopped


async def stop(call: Call, store: RecordingStore, rec: Recording, timeline_limit: int) -> BundleReply:
    """Stop every part, gather the bundle (files, output, merged timeline), close the ports it opened."""
    rec.status = "stopping"
    stopped = await _stop_parts(call, rec, quiet=False)
    rec.stopped_at = time.time()  # after the program's END and dumpcap's last packets
    parts: BundleParts = {}  # none yet: each part the recording has adds its key below
    bundle: BundleReply = {**rec.summary(), **parts, "status": "stopped"}
    sources: list[dict[str, Any]] = []
    if rec.capture_id:
        cap = stopped["capture"]
        bundle["capture"] = {k: cap.get(k) for k in ("capture_id", "status", "stop_reason", "packets", "drops",
                                                     "files", "interfaces", "filter")}
        bundle["capture"]["pcap_path"] = f"capture:{rec.id}"
        sources.append({"pcap": f"capture:{rec.capture_id}", "label": "capture"})
    if rec.execution_id:
        bundle["bpftrace"] = await _bpftrace_output(call, store, rec)
        sources.append({"bpftrace": rec.execution_id, "label": "bpftrace"})
    serial = []
    for port in rec.ports:
        stem = made_stem(f"{rec.id}-{Path(port).name}").replace(".", "_")  # no dot: no extension look-alike
        exported = await call("export_serial_pcapng", {"port": port, "name": stem})
        serial.append({"port": port, "pcapng_path": exported["pcapng_path"], "packets": exported["packets"]})
        sources.append({"serial": port, "label": f"serial:{port}"})
    if serial:
        bundle["serial"] = serial
    if sources:
        bundle["timeline"] = await _timeline(call, store, rec, sources, timeline_limit)
    for port in rec.opened_ports:
        await call("configure_connection", {"port": port, "action": "close"})
    rec.status, rec.bundle = "stopped", bundle
    await trio.to_thread.run_sync(store.write, rec, "bundle.json", json.dumps(bundle, indent=1))
    await trio.to_thread.run_sync(store.save, rec)
    log.info("recording stopped", recording_id=rec.id)
    return bundle


async def _bpftrace_output(call: Call, store: RecordingStore, rec: Recording) -> dict[str, Any]:
    assert rec.execution_id is not None
    result = await call("get_result", {"execution_id": rec.execution_id, "until": "done", "wait_s": 10,
                                       "limit": BPFTRACE_LINES})
    lines = [line if isinstance(line, str) else json.dumps(line) for line in result["output"]]
    path = await trio.to_thread.run_sync(store.write, rec, "bpftrace.txt", "".join(f"{x}\n" for x in lines))
    return {"execution_id": rec.execution_id, "status": result["status"], "lines_total": result["lines_total"],
            "output_path": path, "output_cut": bool(result["has_more"]),
            "first_lines": lines[:20]}


async def _timeline(call: Call, store: RecordingStore, rec: Recording, sources: list[dict[str, Any]],
                    limit: int) -> dict[str, Any]:
    """The parts merged by time over the recording (from its start to its stop); bundle.json keeps up to
    TIMELINE_ROWS rows, the answer `limit`."""
    window = {"sources": sources, "start": rec.created_at, "end": rec.stopped_at}
    merged = await call("diagd_timeline", {**window, "limit": TIMELINE_ROWS})
    path = await trio.to_thread.run_sync(store.write, rec, "timeline.json", json.dumps(merged))
    return {"rows": merged["rows"][:limit], "total": merged["total"], "sources": merged["sources"],
            "span": merged.get("span"), "path": path, "kept": len(merged["rows"]),
            "hint": "diagd_timeline with these sources (and offset) pages the rest", "query": window}
