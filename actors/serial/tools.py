"""The serial MCP tools: each handler checks its arguments, builds a message for the port's actor and
shapes the reply. What a tool changes on a port (the URC buffer, the owner, the raw log, the port
itself) it changes by asking the port's actor; status it reads from the port's record, which only
the actor writes (see `PortRecord`). Schemas are in schemas.py."""

from __future__ import annotations

from functools import partial
from typing import Any

from diagd import __version__
from diagd.actors._paths import caller_stem
from diagd.actors.serial.backend import SerialBackend, enumerate_ports, newest_log, probe
from diagd.actors.serial.codec import iso, parse_hex, unescape
from diagd.actors.serial.export import EXTENSION, export_path, export_session, find_session
from diagd.actors.serial.messages import Close, Configure, ReadUrc, Send, Signals
from diagd.actors.serial.rawlog import LogView, RawLog, read_log_page
from diagd.actors.serial.record import PortRecord
from diagd.actors.serial.replies import (
    ConfigureReply,
    ConnectionStatusReply,
    Exported,
    ExportReply,
    GetLogReply,
    ListedPort,
    ListPortsReply,
    LogPage,
    Outcome,
    ReadUrcReply,
    SendReply,
    SignalsReply,
    WaitPolicy,
)
from diagd.actors.serial.schemas import TOOLS
from diagd.actors.serial.settings import SETTING_KEYS, PortState, port_key
from diagd.actors.tooling import CallContext, ToolSet
from diagd.protocol.errors import DiagdError, ErrorCode

tools: ToolSet[SerialBackend] = ToolSet()


@tools.tool("list_ports", **TOOLS["list_ports"])
async def list_ports(backend: SerialBackend, ctx: CallContext, args: dict[str, Any]) -> ListPortsReply:
    found = await backend.run_blocking(enumerate_ports, backend.access())
    records = backend.records
    for rec in records.values():
        if rec.key not in found and not any(p.get("device") == rec.device for p in found.values()):
            found[rec.key] = {"port": rec.key, "description": "open in diagd", "hwid": "n/a", "allowed": True}
    ports: list[ListedPort] = []
    for name in sorted(found):
        info = found[name]
        match = records.get(name) or next(
            (r for r in records.values() if r.device and r.device == info.get("device")), None)
        state = backend.describe(match, ctx.client)["state"] if match else PortState.CLOSED
        ports.append({"port": name, "description": info["description"], "hwid": info["hwid"],
                      "label": f"{name} - {info['description']}", "allowed": info["allowed"], "state": state})
    names = {p["port"] for p in ports}
    previous, since = backend.hotplug(ctx.client, names)
    return {"ports": ports, "count": len(ports),
            "added": sorted(names - previous) if previous is not None else [],
            "removed": sorted(previous - names) if previous is not None else [],
            "first_call": previous is None, "baseline_from": iso(since)}


@tools.tool("configure_connection", **TOOLS["configure_connection"])
async def configure_connection(backend: SerialBackend, ctx: CallContext, args: dict[str, Any]) -> ConfigureReply:
    key = port_key(args["port"])
    if args["action"] == "close":
        return await _close(backend, ctx, key, args["force"])
    lines: dict[str, bool] = {k: bool(args[k]) for k in ("dtr", "rts") if k in args}
    given = {k: args[k] for k in SETTING_KEYS if k in args}
    await backend.check_allowed(key)
    rec = await backend.lookup(key) or backend.records.get(key)  # another call may have opened it meanwhile
    if rec is None:
        return _opened(backend, ctx, await backend.open(ctx, key, given, lines), "opened", None)
    done = await backend.ask(ctx, rec, Configure(ctx.client, args["force"], given, lines))
    outcome: Outcome = "reopened" if done["reopened"] else "reconfigured"
    return _opened(backend, ctx, rec, outcome, done["took_over_from"])


def _opened(backend: SerialBackend, ctx: CallContext, rec: PortRecord, outcome: Outcome,
            took_over: str | None) -> ConfigureReply:
    return {"success": True, "action": "open", "outcome": outcome, "took_over_from": took_over,
            "discarded_urc_packets": 0, **backend.describe(rec, ctx.client)}


async def _close(backend: SerialBackend, ctx: CallContext, key: str, force: bool) -> ConfigureReply:
    rec = await backend.require(key)
    done = await backend.ask(ctx, rec, Close(ctx.client, force))  # the port is closed when this returns
    backend.closed(ctx, rec)
    return {"success": True, "action": "close", "outcome": "closed", "took_over_from": done["took_over_from"],
            "discarded_urc_packets": done["discarded_urc_packets"], **backend.describe(rec, ctx.client),
            "state": PortState.CLOSED}


@tools.tool("connection_status", **TOOLS["connection_status"])
async def connection_status(backend: SerialBackend, ctx: CallContext, args: dict[str, Any]) -> ConnectionStatusReply:
    if "port" not in args:
        records = [rec for rec in list(backend.records.values()) if await backend.lookup(rec.key) is rec]
        return {"ports": [backend.describe(rec, ctx.client) for rec in records]}
    key = port_key(args["port"])
    rec = await backend.lookup(key)
    if rec is not None:
        return {"ports": [backend.describe(rec, ctx.client)]}
    return {"ports": [await backend.run_blocking(probe, key)]}


@tools.tool("send_data", **TOOLS["send_data"])
async def send_data(backend: SerialBackend, ctx: CallContext, args: dict[str, Any]) -> SendReply:
    rec = await backend.require(port_key(args["port"]))
    raw_patterns = args.get("stop_pattern")
    texts = [raw_patterns] if isinstance(raw_patterns, str) else list(raw_patterns or [])
    policy: WaitPolicy = args.get("wait_policy") or ("keyword" if texts else "timeout")
    if policy == "keyword" and not texts:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "wait_policy=keyword needs a stop_pattern",
                         argument="stop_pattern", hint="e.g. stop_pattern=['OK\\r\\n', 'ERROR\\r\\n']")
    if policy != "keyword" and texts:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"stop_pattern only applies to wait_policy=keyword, "
                         f"not {policy}", argument="stop_pattern")
    payload, line_ending = _payload(args)
    pattern_encoding = args.get("stop_pattern_encoding", args["encoding"])  # no schema default: the payload's
    if pattern_encoding == "hex":
        patterns = {parse_hex(t, what="stop_pattern"): t for t in texts}
    else:
        patterns = {_text(t, "stop_pattern", args["escapes"]): t for t in texts}
    if b"" in patterns:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "stop_pattern must not be empty", argument="stop_pattern")
    return await backend.ask(ctx, rec, Send(
        ctx.client, payload, line_ending, policy, patterns, text_patterns=pattern_encoding == "utf8",
        timeout_s=args["timeout_ms"] / 1000, as_hex=args["as_hex"]))


def _text(value: str, what: str, escapes: bool) -> bytes:
    return unescape(value, what=what) if escapes else value.encode()


def _payload(args: dict[str, Any]) -> tuple[bytes, str | None]:
    """The payload's bytes and its line ending (None: the port's own, appended by the actor)."""
    line_ending: str | None = args.get("line_ending")  # no schema default: the port's own
    if args["encoding"] == "hex":
        if line_ending not in (None, "none"):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "line_ending applies to utf8 payloads; put the "
                             "bytes in the hex payload", argument="line_ending")
        return parse_hex(args["payload"], what="payload"), "none"
    if args["payload"] == "":
        # An empty payload means "just listen": nothing at all is written, not even the port's
        # line ending (a stray CR can make a shell or a modem act).
        if line_ending not in (None, "none"):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "an empty payload writes nothing, so it takes no "
                             "line_ending; to send only a line ending, make it the payload",
                             argument="line_ending", hint="e.g. payload='\\r', line_ending='none'")
        return b"", "none"
    return _text(args["payload"], "payload", args["escapes"]), line_ending


@tools.tool("read_urc", **TOOLS["read_urc"])
async def read_urc(backend: SerialBackend, ctx: CallContext, args: dict[str, Any]) -> ReadUrcReply:
    rec = await backend.require(port_key(args["port"]))
    return await backend.ask(ctx, rec, ReadUrc(ctx.client, args["max_packets"], args["peek"], args["as_hex"]))


@tools.tool("set_signals", **TOOLS["set_signals"])
async def set_signals(backend: SerialBackend, ctx: CallContext, args: dict[str, Any]) -> SignalsReply:
    rec = await backend.require(port_key(args["port"]))
    if all(args.get(k) is None for k in ("dtr", "rts", "break_ms")):  # none has a schema default
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "nothing to do: give dtr, rts and/or break_ms")
    return await backend.ask(ctx, rec, Signals(ctx.client, args.get("dtr"), args.get("rts"), args.get("break_ms")))


@tools.tool("get_log", **TOOLS["get_log"], ui="ui://diagd/serial-console")
async def get_log(backend: SerialBackend, ctx: CallContext, args: dict[str, Any]) -> GetLogReply:
    key = port_key(args["port"])
    rec = await backend.lookup(key)
    view, live = await _session_view(backend, key, rec)
    budget = max(65536, 16 * backend.config().max_reply_bytes)
    try:
        page: LogPage = await backend.run_blocking(partial(
            read_log_page, view, args["offset"], args["limit"], budget, as_hex=args["as_hex"]))
    except FileNotFoundError:
        raise DiagdError(ErrorCode.NOT_FOUND, f"the raw log {view.path} is gone", port=key) from None
    return {"port": rec.key if rec else key, "log_file": str(view.path), "live": live, **page}


async def _session_view(backend: SerialBackend, key: str, rec: PortRecord | None) -> tuple[LogView, bool]:
    """The port's current session log (live: a snapshot of what is written now), else its last one."""
    if rec is not None and rec.log is not None and not rec.log.closed:
        return rec.log.snapshot(), True  # a read of what the actor has written: never waits behind a send
    path = (rec.log_path if rec else None) or backend.last_logs.get(key)
    path = path or await backend.run_blocking(newest_log, backend.log_dir, key)
    if path is None:
        raise DiagdError(ErrorCode.NOT_FOUND, f"no raw log for {key}", port=key)
    return LogView(path, None, None, [], RawLog.INDEX_EVERY), False


@tools.tool("export_serial_pcapng", **TOOLS["export_serial_pcapng"])
async def export_serial_pcapng(backend: SerialBackend, ctx: CallContext, args: dict[str, Any]) -> ExportReply:
    key = port_key(args["port"])
    rec = await backend.lookup(key)
    view, live = await _session_view(backend, key, rec)
    if args.get("session"):
        chosen = await backend.run_blocking(find_session, backend.log_dir, key, args["session"])
        if chosen != view.path:
            view, live = LogView(chosen, None, None, [], RawLog.INDEX_EVERY), False
    config = backend.config()
    stem = caller_stem(args["name"], argument="name", extension=EXTENSION) if args.get("name") else None
    out = await backend.run_blocking(export_path, backend.log_dir / "exports", key, config.export_keep, stem)
    try:
        done: Exported = await backend.run_blocking(partial(
            export_session, view.path, out, end=view.size, port=key, application=f"diagd {__version__}"))
    except FileNotFoundError:
        raise DiagdError(ErrorCode.NOT_FOUND, f"the raw log {view.path} is gone", port=key) from None
    except FileExistsError:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"an export named {out.name} exists: exports never overwrite "
                         "a file", argument="name", path=str(out),
                         hint="choose another name, or omit name for a fresh one diagd makes") from None
    except OSError as exc:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"cannot write {out}: {exc.strerror}", path=str(out)) from None
    notes = []
    if done["packets"] == 0:
        notes.append("the session has no Tx/Rx data yet: the capture holds no packets")
    if done["log_limit_reached"]:
        notes.append(f"the session stopped logging data at [serial] log_max_bytes={config.log_max_bytes}: "
                     "later bytes are not in the log, so not in the capture")
    if done["unreadable_records"]:
        notes.append(f"{done['unreadable_records']} log records could not be read and were skipped")
    if live:
        notes.append("the session is still open: the capture holds its records up to now")
    return {"port": key, "session": view.path.name, "log_file": str(view.path), "live": live,
            "pcapng_path": str(out), **done, "link_type": "wireshark-upper-pdu (data-text-lines)",
            "notes": notes}
