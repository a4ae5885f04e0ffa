"""The serial tools of one daemon: port records, ownership, hot-plug snapshots."""

from __future__ import annotations

import glob
import math
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import trio

from diagd.actors.base import ActorGone, Op
from diagd.actors.runtime import Runtime
from diagd.actors.serial.actor import KIND, PortRecord, SerialActor, not_open_error
from diagd.actors.serial.codec import iso, parse_hex, unescape
from diagd.actors.serial.port import BlockingRunner, Opener, open_posix_port, port_holders
from diagd.actors.serial.rawlog import LogView, RawLog, read_log_page, session_logs
from diagd.actors.serial.schemas import TOOLS
from diagd.actors.serial.settings import LINE_ENDINGS, SETTING_KEYS, PortSettings, PortState, SerialConfig, port_key
from diagd.actors.serial.urc import UrcBuffer
from diagd.actors.tooling import CallContext, ToolSpec
from diagd.protocol.errors import DiagdError, ErrorCode


class SerialBackend:
    """The serial tools of one daemon: port records, ownership, hot-plug snapshots."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.records: dict[str, PortRecord] = {}
        self.last_logs: dict[str, Path] = {}
        self.opener: Opener = open_posix_port
        self.run_blocking: BlockingRunner = trio.to_thread.run_sync
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
        if owner is None:
            return False
        kind, _, pid = owner.rpartition(":")
        if not any(str(c.pid) == pid for c in self.runtime.clients()):
            return False
        # A `diagd call` process makes its one call and exits, and the daemon may see its socket
        # close only after the next command's call has arrived: an exited process is not connected,
        # whatever the connection table says yet (else `diagd call`s in a row get BUSY at random).
        return kind != "cli" or _process_running(pid)

    def authorize(self, rec: PortRecord, client: str, *, force: bool = False) -> str | None:
        """Let `client` act on the port; returns the previous owner when it takes the port over."""
        owner = rec.owner
        if owner == client:
            return None
        if owner is None or force or not self.owner_connected(owner):
            rec.owner = client
            if rec.log is not None:
                rec.log.event("owner", time.time(), owner=client, previous=owner, forced=force)
            return owner
        raise DiagdError(ErrorCode.BUSY, f"{rec.key} is Occupied: held by another diagd client ({owner})",
                         port=rec.key, state=str(PortState.OCCUPIED), owner=owner,
                         hint="configure_connection(port, action='open', force=true) takes it over")

    def describe(self, rec: PortRecord, viewer: str) -> dict[str, Any]:
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

    async def ask(self, ctx: CallContext, rec: PortRecord, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Ask the port's actor; "not open" if it went away meanwhile (a port is never reopened implicitly)."""
        ref = self.runtime.find(KIND, rec.key)
        if ref is None:
            raise not_open_error(rec.key, [])
        try:
            return await self.runtime.ask(ref, Op(op, args), progress=ctx.progress)
        except ActorGone:
            raise not_open_error(rec.key, []) from None

    async def check_allowed(self, key: str) -> None:
        allowed = self.config().allowed_ports
        if allowed:
            devices, real = await self.run_blocking(_allowed_devices, allowed, key)
            if real not in devices:
                raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{key} is not in [serial] allowed_ports",
                                 port=key, device=real, allowed_ports=list(allowed))

    # -- tools --------------------------------------------------------------------------------

    async def list_ports(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        allowed = self.config().allowed_ports
        found = await self.run_blocking(_enumerate, allowed)
        for rec in self.records.values():
            if rec.key not in found and not any(p.get("device") == rec.device for p in found.values()):
                found[rec.key] = {"port": rec.key, "description": "open in diagd", "hwid": "n/a", "allowed": True}
        ports = []
        for name in sorted(found):
            info = found[name]
            match = self.records.get(name) or next(
                (r for r in self.records.values() if r.device and r.device == info.get("device")), None)
            state = self.describe(match, ctx.client)["state"] if match else str(PortState.CLOSED)
            ports.append({"port": name, "description": info["description"], "hwid": info["hwid"],
                          "label": f"{name} - {info['description']}", "allowed": info["allowed"], "state": state})
        names = {p["port"] for p in ports}
        previous = self._seen.get(ctx.client)
        since = self._last_seen[0] if previous is None and self._last_seen else None
        if previous is None and self._last_seen:
            previous = self._last_seen[1]
        self._seen[ctx.client] = names
        self._seen.move_to_end(ctx.client)
        while len(self._seen) > 64:
            self._seen.popitem(last=False)
        self._last_seen = (time.time(), names)
        return {"ports": ports, "count": len(ports),
                "added": sorted(names - previous) if previous is not None else [],
                "removed": sorted(previous - names) if previous is not None else [],
                "first_call": previous is None, "baseline_from": iso(since)}

    async def configure_connection(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        key = port_key(args["port"])
        if args.get("action", "open") == "close":
            return await self._close(ctx, key, bool(args.get("force")))
        lines: dict[str, bool] = {k: bool(args[k]) for k in ("dtr", "rts") if k in args}
        given = {k: args[k] for k in SETTING_KEYS if k in args}
        config = self.config()
        await self.check_allowed(key)
        rec = await self.lookup(key) or self.records.get(key)  # another call may have opened it meanwhile
        if rec is not None:
            took_over = self.authorize(rec, ctx.client, force=bool(args.get("force")))
            done = await self.ask(ctx, rec, "configure", {"settings": replace(rec.settings, **given), "lines": lines})
            return self._opened(ctx, rec, "reopened" if done["reopened"] else "reconfigured", took_over)
        settings = replace(PortSettings(baudrate=config.baudrate, idle_ms=config.idle_ms), **given)
        new = PortRecord(key=key, settings=settings, config=config, log_dir=self.log_dir, opener=self.opener,
                         run_blocking=self.run_blocking, owner=ctx.client, lines=lines,
                         urc=UrcBuffer(config.urc_max_packets, config.urc_max_bytes))
        self.records[key] = new
        try:
            await self.runtime.start(KIND, key, lambda: SerialActor(new), idle_timeout_s=math.inf)
        except BaseException:
            if self.records.get(key) is new:
                del self.records[key]
            raise
        return self._opened(ctx, new, "opened", None)

    def _opened(self, ctx: CallContext, rec: PortRecord, outcome: str, took_over: str | None) -> dict[str, Any]:
        return {"success": True, "action": "open", "outcome": outcome, "took_over_from": took_over,
                "discarded_urc_packets": 0, **self.describe(rec, ctx.client)}

    async def _close(self, ctx: CallContext, key: str, force: bool) -> dict[str, Any]:
        rec = await self.require(key)
        took_over = self.authorize(rec, ctx.client, force=force)
        ref = self.runtime.find(KIND, rec.key)
        if ref is not None:
            await self.ask(ctx, rec, "close", {})  # the port is closed when this returns
            self.runtime.stop(ref, reason=f"closed by {ctx.client}")
        self._forget(rec)
        return {"success": True, "action": "close", "outcome": "closed", "took_over_from": took_over,
                "discarded_urc_packets": len(rec.urc), **self.describe(rec, ctx.client),
                "state": str(PortState.CLOSED)}

    async def connection_status(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        if "port" not in args:
            records = [rec for rec in list(self.records.values()) if await self.lookup(rec.key) is rec]
            return {"ports": [self.describe(rec, ctx.client) for rec in records]}
        key = port_key(args["port"])
        rec = await self.lookup(key)
        if rec is not None:
            return {"ports": [self.describe(rec, ctx.client)]}
        return {"ports": [await self.run_blocking(_probe, key)]}

    async def send_data(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = await self.require(port_key(args["port"]))
        self.authorize(rec, ctx.client)
        encoding = args.get("encoding", "utf8")
        escapes = args.get("escapes", True)

        def text(value: str, *, what: str) -> bytes:
            return unescape(value, what=what) if escapes else value.encode()

        raw_patterns = args.get("stop_pattern")
        texts = [raw_patterns] if isinstance(raw_patterns, str) else list(raw_patterns or [])
        policy = args.get("wait_policy") or ("keyword" if texts else "timeout")
        if policy == "keyword" and not texts:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "wait_policy=keyword needs a stop_pattern",
                             argument="stop_pattern", hint="e.g. stop_pattern=['OK\\r\\n', 'ERROR\\r\\n']")
        if policy != "keyword" and texts:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"stop_pattern only applies to wait_policy=keyword, "
                             f"not {policy}", argument="stop_pattern")
        if encoding == "hex":
            if args.get("line_ending", "none") != "none":
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, "line_ending applies to utf8 payloads; put the "
                                 "bytes in the hex payload", argument="line_ending")
            payload = parse_hex(args["payload"], what="payload")
        elif args["payload"] == "":
            # An empty payload means "just listen": nothing at all is written, not even the port's
            # line ending (a stray CR can make a shell or a modem act).
            if args.get("line_ending", "none") != "none":
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, "an empty payload writes nothing, so it takes no "
                                 "line_ending; to send only a line ending, make it the payload",
                                 argument="line_ending", hint="e.g. payload='\\r', line_ending='none'")
            payload = b""
        else:
            payload = text(args["payload"], what="payload") + LINE_ENDINGS[
                args.get("line_ending", rec.settings.line_ending)]
        if args.get("stop_pattern_encoding", encoding) == "hex":
            patterns = {parse_hex(t, what="stop_pattern"): t for t in texts}
        else:
            patterns = {text(t, what="stop_pattern"): t for t in texts}
        if b"" in patterns:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "stop_pattern must not be empty", argument="stop_pattern")
        return await self.ask(ctx, rec, "send", {
            "payload": payload, "wait_policy": policy, "patterns": patterns,
            "text_patterns": args.get("stop_pattern_encoding", encoding) == "utf8",
            "timeout_s": args.get("timeout_ms", 1000) / 1000, "as_hex": bool(args.get("as_hex"))})

    async def read_urc(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = await self.require(port_key(args["port"]))
        peek = bool(args.get("peek"))
        if not peek:
            self.authorize(rec, ctx.client)
        packets, dropped = rec.urc.take(args.get("max_packets", 50), 4 * rec.config.max_reply_bytes, peek=peek)
        as_hex = bool(args.get("as_hex"))
        # pending_urc_count is what the buffer holds after this call, as in send_data and
        # connection_status: after a peek, the packets shown are still pending.
        pending = len(rec.urc)
        return {"port": rec.key, "state": str(rec.state), "packets": [p.to_json(as_hex=as_hex) for p in packets],
                "returned": len(packets), "pending_urc_count": pending,
                "has_more": pending > (len(packets) if peek else 0),
                "dropped": dropped, "dropped_total": rec.urc.dropped_total}

    async def set_signals(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = await self.require(port_key(args["port"]))
        self.authorize(rec, ctx.client)
        if all(args.get(k) is None for k in ("dtr", "rts", "break_ms")):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "nothing to do: give dtr, rts and/or break_ms")
        return await self.ask(ctx, rec, "signals", {k: args.get(k) for k in ("dtr", "rts", "break_ms")})

    async def get_log(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        key = port_key(args["port"])
        rec = await self.lookup(key)
        live = rec is not None and rec.log is not None and not rec.log.closed
        if rec is not None and rec.log is not None and live:
            view = rec.log.snapshot()
        else:
            path = (rec.log_path if rec else None) or self.last_logs.get(key)
            path = path or await self.run_blocking(_newest_log, self.log_dir, key)
            if path is None:
                raise DiagdError(ErrorCode.NOT_FOUND, f"no raw log for {key}", port=key)
            view = LogView(path, None, None, [], RawLog.INDEX_EVERY)
        budget = max(65536, 16 * self.config().max_reply_bytes)
        try:
            page = await self.run_blocking(partial(
                read_log_page, view, args.get("offset", 0), args.get("limit", 100), budget,
                as_hex=bool(args.get("as_hex"))))
        except FileNotFoundError:
            raise DiagdError(ErrorCode.NOT_FOUND, f"the raw log {view.path} is gone", port=key) from None
        return {"port": rec.key if rec else key, "log_file": str(view.path), "live": live, **page}

    def specs(self) -> list[ToolSpec]:
        handlers = {"list_ports": self.list_ports, "configure_connection": self.configure_connection,
                    "connection_status": self.connection_status, "send_data": self.send_data,
                    "read_urc": self.read_urc, "set_signals": self.set_signals, "get_log": self.get_log}
        return [ToolSpec(name=name, handler=handlers[name], **spec) for name, spec in TOOLS.items()]


def _allowed_devices(patterns: tuple[str, ...], key: str) -> tuple[set[str], str]:
    devices = set()
    for entry in patterns:
        entry = os.path.expanduser(entry)
        for path in glob.glob(entry) if glob.has_magic(entry) else [entry]:
            devices.add(os.path.realpath(path))
    return devices, os.path.realpath(key)


def _enumerate(allowed: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    from serial.tools import list_ports

    found: dict[str, dict[str, Any]] = {}
    for info in list_ports.comports():
        found[info.device] = {"description": info.description or "n/a", "hwid": info.hwid or "n/a"}
    for entry in allowed:  # configured ports the kernel does not enumerate (ptys, by-id links)
        entry = os.path.expanduser(entry)
        for path in glob.glob(entry) if glob.has_magic(entry) else [entry]:
            if path not in found and os.path.exists(path):
                found[path] = {"description": "configured in [serial] allowed_ports", "hwid": "n/a"}
    devices = _allowed_devices(allowed, "/")[0] if allowed else set()
    for path, info in found.items():
        info["device"] = os.path.realpath(path)
        info["allowed"] = not allowed or info["device"] in devices
    return found


def _probe(key: str) -> dict[str, Any]:
    if not os.path.exists(key):
        raise DiagdError(ErrorCode.NOT_FOUND, f"no such port: {key}", port=key,
                         hint="list_ports shows the ports this machine has")
    holders = port_holders(key)
    return {"port": key, "device": os.path.realpath(key),
            "state": str(PortState.OCCUPIED if holders else PortState.CLOSED), "owner": None, "you_own": False,
            "holders": holders}


def _process_running(pid: str) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        stat_line = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return False
    fields = stat_line.rpartition(")")[2].split()  # after the command name, which may hold anything
    return bool(fields) and fields[0] not in ("Z", "X")


def _newest_log(log_dir: Path, key: str) -> Path | None:
    logs = session_logs(log_dir, key)
    return logs[-1] if logs else None
