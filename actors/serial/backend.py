"""The serial back end's own state: the open ports' records, the config, hot-plug snapshots, and the
blocking helpers the tools run in a thread (enumeration, allow-list, probes)."""

from __future__ import annotations

import glob
import math
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from diagd.actors.base import ActorGone
from diagd.actors.message import Message, ReplyT
from diagd.actors.runtime import ActorRef, Runtime
from diagd.actors.serial.access import PortAccess, PtyScan, held_ptys
from diagd.actors.serial.actor import KIND, SerialActor, not_open_error
from diagd.actors.serial.port import BlockingRunner, Opener, open_posix_port, port_holders
from diagd.actors.serial.rawlog import session_logs
from diagd.actors.serial.record import PortRecord
from diagd.actors.serial.replies import PortStatus
from diagd.actors.serial.settings import PortState, SerialConfig
from diagd.actors.serial.urc import UrcBuffer
from diagd.actors.tooling import CallContext
from diagd.protocol.errors import DiagdError, ErrorCode


class SerialBackend:
    """The serial back end of one daemon: what its tools share (tools.py holds the tools)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.records: dict[str, PortRecord] = {}
        self.last_logs: dict[str, Path] = {}
        self.opener: Opener = open_posix_port
        self.run_blocking: BlockingRunner = trio.to_thread.run_sync
        self.held_ptys: PtyScan = held_ptys  # the ptys diagd holds (a seam: in-process tests hold their modems')
        self._raw_config: Mapping[str, Any] | None = None
        self._config = SerialConfig()
        self._seen: OrderedDict[str, set[str]] = OrderedDict()
        self._last_seen: tuple[float, set[str]] | None = None

    @property
    def log_dir(self) -> Path:
        return self.runtime.state_dir

    def config(self) -> SerialConfig:
        raw = self.runtime.config().table
        if raw is not self._raw_config:
            self._config = SerialConfig.parse(raw)
            self._raw_config = raw
        return self._config

    # -- records and ownership ----------------------------------------------------------------

    def owner_connected(self, owner: str | None) -> bool:
        """Whether `owner` is still connected (the actor asks this before a silent take-over)."""
        if owner is None:
            return False
        kind, _, pid = owner.rpartition(":")
        if not any(str(c.pid) == pid for c in self.runtime.clients()):
            return False
        # A `diagd call` process makes its one call and exits, and the daemon may see its socket
        # close only after the next command's call has arrived: an exited process is not connected,
        # whatever the connection table says yet (else `diagd call`s in a row get BUSY at random).
        return kind != "cli" or _process_running(pid)

    def may_stop(self, ref: ActorRef, client: str) -> None:
        """diagd_stop_actor on a port's actor: refused like the port's own tools while another connected
        client owns the port (BUSY, naming the owner)."""
        rec = self.records.get(ref.resource)
        owner = rec.owner if rec is not None else None
        if owner is not None and owner != client and self.owner_connected(owner):
            raise DiagdError(ErrorCode.BUSY, f"{ref.resource} is Occupied: held by another diagd client ({owner})",
                             port=ref.resource, state=str(PortState.OCCUPIED), owner=owner,
                             hint="only its owner stops it; configure_connection(port, action='close', force=true) "
                                  "takes it over and closes it")

    def describe(self, rec: PortRecord, viewer: str) -> PortStatus:
        return rec.describe(viewer, owner_connected=self.owner_connected(rec.owner))

    async def lookup(self, key: str) -> PortRecord | None:
        rec = self.records.get(key)
        if rec is None and self.records:  # another name of a port we hold open? (not of one that went
            real = await self.run_blocking(os.path.realpath, key)  # away: its device name may be reused)
            rec = next((r for r in self.records.values() if r.device == real and r.state == PortState.CONNECTED),
                       None)
        if rec is not None and rec.state != PortState.OPENING and self.runtime.find(KIND, rec.key) is None:
            self._forget(rec)  # its actor was stopped (diagd_stop_actor) or failed for good
            return None
        return rec

    async def require(self, key: str) -> PortRecord:
        rec = await self.lookup(key)
        if rec is None:
            raise not_open_error(key, sorted(self.records))
        return rec

    def _forget(self, rec: PortRecord) -> None:
        if self.records.get(rec.key) is rec:
            del self.records[rec.key]
        if rec.log_path is not None:
            self.last_logs[rec.key] = rec.log_path

    async def ask(self, ctx: CallContext, rec: PortRecord, message: Message[ReplyT]) -> ReplyT:
        """Ask the port's actor; "not open" if it went away meanwhile (a port is never reopened implicitly)."""
        ref = self.runtime.find(KIND, rec.key)
        if ref is None:
            raise not_open_error(rec.key, [])
        try:
            return await self.runtime.ask(ref, message, progress=ctx.progress)
        except ActorGone:
            raise not_open_error(rec.key, []) from None

    async def open(self, ctx: CallContext, key: str, given: dict[str, Any], lines: dict[str, bool]) -> PortRecord:
        """Start the actor of a port that is not open: its record is the actor's state from now on."""
        config = self.config()
        settings = replace(config.port_settings(key), **given)
        new = PortRecord(key=key, settings=settings, config=config, log_dir=self.log_dir, opener=self.opener,
                         run_blocking=self.run_blocking, owner=ctx.client, lines=lines,
                         urc=UrcBuffer(config.urc_max_packets, config.urc_max_bytes),
                         owner_connected=self.owner_connected)
        self.records[key] = new
        try:
            await self.runtime.start(KIND, key, lambda: SerialActor(new), idle_timeout_s=math.inf)
        except BaseException:
            if self.records.get(key) is new:
                del self.records[key]
            raise
        return new

    def closed(self, ctx: CallContext, rec: PortRecord) -> None:
        """The port's actor has closed it: stop the actor and keep only the log's path."""
        ref = self.runtime.find(KIND, rec.key)
        if ref is not None:
            self.runtime.stop(ref, reason=f"closed by {ctx.client}")
        self._forget(rec)

    def hotplug(self, client: str, names: set[str]) -> tuple[set[str] | None, float | None]:
        """The ports `client` saw at its last list_ports (or, at its first, anyone's last), and when."""
        previous = self._seen.get(client)
        since = self._last_seen[0] if previous is None and self._last_seen else None
        if previous is None and self._last_seen:
            previous = self._last_seen[1]
        self._seen[client] = names
        self._seen.move_to_end(client)
        while len(self._seen) > 64:
            self._seen.popitem(last=False)
        self._last_seen = (time.time(), names)
        return previous, since

    async def check_allowed(self, key: str) -> None:
        """Refuse `key` unless a client may open it: [serial] allowed_ports, and pseudo-terminals only
        when allowed_ports names them and never one diagd itself holds (access.py)."""
        await self.run_blocking(self.access().check, key)

    def access(self) -> PortAccess:
        """The rules ports are opened (and listed as allowed) by, as of now."""
        own = tuple(rec.device for rec in self.records.values()
                    if rec.device is not None and rec.state == PortState.CONNECTED)
        return PortAccess(self.config().allowed_ports, self.held_ptys, own)


def enumerate_ports(access: PortAccess) -> dict[str, dict[str, Any]]:
    from serial.tools import list_ports

    found: dict[str, dict[str, Any]] = {}
    for info in list_ports.comports():
        found[info.device] = {"description": info.description or "n/a", "hwid": info.hwid or "n/a"}
    for entry in access.allowed:  # configured ports the kernel does not enumerate (ptys, by-id links)
        entry = os.path.expanduser(entry)
        for path in glob.glob(entry) if glob.has_magic(entry) else [entry]:
            if path not in found and os.path.exists(path):
                found[path] = {"description": "configured in [serial] allowed_ports", "hwid": "n/a"}
    for path, info in found.items():
        info["device"] = os.path.realpath(path)
        info["allowed"] = access.refusal(path) is None
    return found


def probe(key: str) -> PortStatus:
    if not os.path.exists(key):
        raise DiagdError(ErrorCode.NOT_FOUND, f"no such port: {key}", port=key,
                         hint="list_ports shows the ports this machine has")
    holders = port_holders(key)
    return {"port": key, "device": os.path.realpath(key),
            "state": PortState.OCCUPIED if holders else PortState.CLOSED, "owner": None, "you_own": False,
            "holders": holders}


def _process_running(pid: str) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        stat_line = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return False
    fields = stat_line.rpartition(")")[2].split()  # after the command name, which may hold anything
    return bool(fields) and fields[0] not in ("Z", "X")


def newest_log(log_dir: Path, key: str) -> Path | None:
    logs = session_logs(log_dir, key)
    return logs[-1] if logs else None
