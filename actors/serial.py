"""Serial ports: one actor per open port, the Serial-Agent-MCP tools, and a raw Tx/Rx log.

The tool is a stateless executor: it never interprets what a device says; the agent decides what
to send and how to wait. The daemon owns each open port until it is closed, so nothing the device
says is missed between calls, even with no agent connected.

Per open port, the actor owns the pyserial port (opened `exclusive=True`: a port another program
has flock-ed is "Occupied"), a reader task on the port's fd (`wait_readable` + non-blocking
`os.read`, never a blocking call on the Trio loop), an idle slicer on the Trio clock, the URC
buffer and the raw log. Bytes that arrive while a `send_data` call waits belong to that call's
reply; all others are cut into packets at idle gaps (`idle_ms`, restarted on every read) and go
to the URC buffer (bounded; overflow drops the oldest packets and counts them).

States: Connected; Disconnected (the device went away: hang-up or I/O error; the next call says
so, `configure_connection(action=open)` reopens it when it is back); Occupied (held by another
connected diagd client, or locked/held by another program); Closed (not open in diagd).
A port belongs to the diagd client that opened it; another client gets BUSY while the owner is
still connected (`force=true` on `configure_connection` takes it over) and takes it over silently
once the owner has disconnected (so successive `diagd call` commands work).

Raw log: one file per port session, `<state_dir>/serial/<port-slug>-<UTC time>.jsonl`, the
source of truth. One JSON object per line, in order of occurrence:
    {"ts": 1718000000.123456, "dir": "tx"|"rx", "hex": "41540D"}      bytes written / read
    {"ts": ..., "dir": "event", "event": "session", "port": ..., "device": ..., "settings": {...}}
    {"ts": ..., "dir": "event", "event": "settings"|"signals"|"owner"|"disconnected"|"log_limit"|"closed", ...}
`ts` is wall-clock Unix time of the write or read (microseconds); `hex` is uppercase without
spaces; record 0 is the session header. `get_log` pages it by record index. A session stops
logging data past [serial] log_max_bytes (recorded as a "log_limit" event, counted in
connection_status); the newest [serial] log_keep sessions per port are kept.

Config ([serial], all optional): allowed_ports (paths or globs, compared after resolving
symlinks; empty = any), baudrate, idle_ms, max_reply_bytes, urc_max_packets, urc_max_bytes,
write_timeout_ms, log_max_bytes, log_keep. Read when a port is opened (reload applies to ports
opened afterwards).
"""

from __future__ import annotations

import contextlib
import errno
import glob
import math
import os
import re
import select
import stat
import termios
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import serial
import trio

from diagd.actors._serial_codec import (
    LINE_ENDINGS,
    SETTING_KEYS,
    TOOLS,
    LogView,
    Packet,
    PortSettings,
    PortState,
    RawLog,
    ReplyCollector,
    SerialConfig,
    Slicer,
    UrcBuffer,
    decode,
    iso,
    parse_hex,
    port_key,
    port_slug,
    read_log_page,
    unescape,
)
from diagd.actors.base import Actor, ActorGone, Op, Request, RestartKind, SupervisionPolicy
from diagd.actors.runtime import Runtime
from diagd.actors.tooling import CallContext, ToolSpec
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

KIND = "serial"
READ_SIZE = 16384


class PortGone(Exception):
    """The device went away (hang-up, I/O error): the port is Disconnected."""


class SettingRefused(Exception):
    """The device did not take one setting; the port has been put back as it was."""

    def __init__(self, key: str, value: Any, reason: str) -> None:
        super().__init__(f"{key}={value!r}: {reason}")
        self.key, self.value, self.reason = key, value, reason


# The order pyserial applies settings in (SerialBase._SAVED_SETTINGS); each change is one tcsetattr.
DEVICE_KEYS = ("baudrate", "bytesize", "parity", "stopbits", "xonxoff", "dsrdtr", "rtscts")
_CMSPAR = 0o10000000000  # "stick" (mark/space) parity; the termios module does not export it
_PARITY_BITS = {"N": 0, "E": termios.PARENB, "O": termios.PARENB | termios.PARODD,
                "M": termios.PARENB | termios.PARODD | _CMSPAR, "S": termios.PARENB | _CMSPAR}
_SIZE_BITS = {5: termios.CS5, 6: termios.CS6, 7: termios.CS7, 8: termios.CS8}


def _not_in_effect(fd: int, key: str, value: Any) -> str | None:
    """Why the line does not have `key=value` although tcsetattr succeeded, or None if it has it.

    tcsetattr succeeds when any part of a change was made, and a driver may drop what it cannot do
    (a pty takes a baud rate change but drops parity and character size in the same call), so
    what counts is what reads back. The baud rate is not compared: drivers legitimately round it
    and report the rate they achieved.
    """
    iflag, _oflag, cflag, _lflag, _ispeed, _ospeed, _cc = termios.tcgetattr(fd)
    if key == "bytesize":
        ok = cflag & termios.CSIZE == _SIZE_BITS[value]
    elif key == "parity":
        ok = cflag & (termios.PARENB | termios.PARODD | _CMSPAR) == _PARITY_BITS[value]
    elif key == "stopbits":
        ok = bool(cflag & termios.CSTOPB) == (value != 1)
    elif key == "rtscts":
        ok = bool(cflag & termios.CRTSCTS) == value
    elif key == "xonxoff":
        ok = (iflag & (termios.IXON | termios.IXOFF) == termios.IXON | termios.IXOFF) == value
    else:
        return None
    return None if ok else "the device did not take it (it does not read back)"


def _as_oserror(exc: termios.error) -> OSError:
    """termios.error is not an OSError, though it carries (errno, text) like one."""
    code, text = (*exc.args, 0, str(exc))[:2]
    return OSError(code, text)


def _set(ser: Any, key: str, value: Any) -> None:
    """One pyserial setting: it reconfigures the open port at once."""
    try:
        setattr(ser, key, value)
    except termios.error as exc:
        raise _as_oserror(exc) from None


def apply_settings(ser: Any, wanted: dict[str, Any]) -> None:
    """Change an open port's settings one at a time, so a refusal names the setting; on a refusal,
    walk back through states the port was just in (each one it took) and raise SettingRefused.

    A refusal: pyserial's ValueError (e.g. a custom baud rate the driver rejects), EINVAL from
    tcsetattr, or a setting that does not read back. Any other OSError (the device went away)
    propagates unchanged.
    """
    done: list[tuple[str, Any]] = []
    for key in DEVICE_KEYS:
        old = getattr(ser, key)
        if key not in wanted or wanted[key] == old:
            continue
        try:
            _set(ser, key, wanted[key])
            reason = _not_in_effect(ser.fileno(), key, wanted[key])
        except ValueError as exc:
            reason = str(exc)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            reason = os.strerror(errno.EINVAL)
        if reason is None:
            done.append((key, old))
            continue
        for back_key, back_value in [(key, old), *reversed(done)]:
            _set(ser, back_key, back_value)
        raise SettingRefused(key, wanted[key], reason)


class PortIO(Protocol):
    """The narrow port interface the actor needs; `PosixPort` on pyserial, scripted fakes in tests."""

    async def receive(self) -> bytes: ...  # waits for bytes; raises PortGone
    async def write_some(self, data: memoryview) -> int: ...  # raises PortGone
    def apply(self, settings: PortSettings) -> None: ...
    def set_lines(self, dtr: bool | None, rts: bool | None) -> None: ...
    def set_break(self, on: bool) -> None: ...
    def modem_lines(self) -> dict[str, bool] | None: ...
    def close(self) -> None: ...


Opener = Callable[[str, PortSettings, dict[str, bool]], Awaitable[PortIO]]
# Runs a blocking helper (path resolution, log files, /proc scans) off the Trio loop. A seam, so
# virtual-clock tests can run them inline: a thread would let MockClock's autojump fire deadlines.
BlockingRunner = Callable[..., Awaitable[Any]]


class PosixPort:
    """A pyserial port driven from Trio through its non-blocking fd."""

    def __init__(self, ser: Any) -> None:
        self.ser = ser
        self.fd: int = ser.fileno()
        self._closed = False

    async def receive(self) -> bytes:
        while True:
            try:
                await trio.lowlevel.wait_readable(self.fd)
            except trio.ClosedResourceError:
                raise PortGone("port closed") from None
            try:
                data = os.read(self.fd, READ_SIZE)
            except BlockingIOError:
                continue
            except OSError as exc:
                raise PortGone(f"read failed: {os.strerror(exc.errno or 0)}") from None
            if data:
                return data
            # Readable but empty (VMIN=0): a hang-up, or another reader took the bytes.
            poller = select.poll()
            poller.register(self.fd, select.POLLHUP | select.POLLERR)
            if poller.poll(0):
                raise PortGone("hang-up: the device or the other end of the line went away")
            await trio.sleep(0.01)

    async def write_some(self, data: memoryview) -> int:
        while True:
            try:
                return os.write(self.fd, data)
            except BlockingIOError:
                pass
            except OSError as exc:
                raise PortGone(f"write failed: {os.strerror(exc.errno or 0)}") from None
            try:
                await trio.lowlevel.wait_writable(self.fd)
            except trio.ClosedResourceError:
                raise PortGone("port closed") from None

    def apply(self, settings: PortSettings) -> None:
        apply_settings(self.ser, settings.pyserial())

    def set_lines(self, dtr: bool | None, rts: bool | None) -> None:
        if dtr is not None:
            self.ser.dtr = dtr
        if rts is not None:
            self.ser.rts = rts

    def set_break(self, on: bool) -> None:
        self.ser.break_condition = on

    def modem_lines(self) -> dict[str, bool] | None:
        try:
            return {"cts": self.ser.cts, "dsr": self.ser.dsr, "ri": self.ser.ri, "cd": self.ser.cd}
        except OSError:
            return None  # no modem lines (a pty, some USB adapters)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self.fd)  # wakes a task still waiting on the fd
            self.ser.close()


async def open_posix_port(device: str, settings: PortSettings, lines: dict[str, bool]) -> PortIO:
    def _open() -> Any:
        try:
            mode = os.stat(device).st_mode
        except FileNotFoundError:
            raise DiagdError(ErrorCode.NOT_FOUND, f"no such port: {device}", port=device,
                             hint="list_ports shows the ports this machine has") from None
        if not stat.S_ISCHR(mode):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{device} is not a character device", port=device)
        wanted = settings.pyserial()
        ser = serial.Serial()
        ser.port = device
        # Opened at the wanted speed and 8N1, then set one setting at a time (as on an open port): a
        # device that refuses one is told apart from the others, and a pty that would silently drop
        # parity taken together with a speed change is caught (see _not_in_effect).
        ser.baudrate = wanted["baudrate"]
        ser.exclusive = True
        ser.timeout = 0
        if "dtr" in lines:
            ser.dtr = lines["dtr"]  # applied by open(): no reset pulse when asked for dtr=false
        if "rts" in lines:
            ser.rts = lines["rts"]
        try:
            ser.open()
        except ValueError as exc:
            raise SettingRefused("baudrate", wanted["baudrate"], str(exc)) from None
        except termios.error as exc:
            error = _as_oserror(exc)
            if error.errno == errno.EINVAL:
                raise SettingRefused("baudrate", wanted["baudrate"], os.strerror(errno.EINVAL)) from None
            raise OSError(error.errno, f"cannot set up {device}: {error.strerror}") from None
        try:
            apply_settings(ser, wanted)
        except BaseException:
            ser.close()
            raise
        return ser

    try:
        return PosixPort(await trio.to_thread.run_sync(_open))
    except SettingRefused as exc:
        raise refused_error(device, exc, "the port stays closed") from None
    except ValueError as exc:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"invalid settings for {device}: {exc}", port=device) from None
    except OSError as exc:  # serial.SerialException is an OSError
        raise await _open_error(device, exc) from None


def refused_error(port: str, exc: SettingRefused, outcome: str) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"{port} refused {exc.key}={exc.value!r}: {exc.reason}; {outcome}",
                      port=port, argument=exc.key, value=exc.value, reason=exc.reason)


async def _open_error(device: str, exc: OSError) -> DiagdError:
    code, text = exc.errno, str(exc)
    if code in (errno.EAGAIN, errno.EBUSY):
        holders = await trio.to_thread.run_sync(port_holders, device)
        return DiagdError(ErrorCode.BUSY, f"{device} is Occupied: locked or in use by another program",
                          port=device, state=str(PortState.OCCUPIED), holders=holders)
    if code in (errno.ENOENT, errno.ENODEV, errno.ENXIO):
        return DiagdError(ErrorCode.NOT_FOUND, f"no such port: {device} ({os.strerror(code)})", port=device)
    if code in (errno.EACCES, errno.EPERM):
        return DiagdError(ErrorCode.PERMISSION_DENIED, f"diagd may not open {device}", port=device,
                          hint="serial devices usually need membership of the dialout group")
    if "configure" in text:
        return DiagdError(ErrorCode.INVALID_ARGUMENT, f"{device} is not a serial port: {text}", port=device)
    return DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot open {device}: {text}", port=device)


def port_holders(device: str) -> list[dict[str, Any]]:
    """Processes that have `device` open (like fuser); what we can see without privileges."""
    real = os.path.realpath(device)
    out: list[dict[str, Any]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(fd.path) for fd in os.scandir(f"{entry.path}/fd")]
        except OSError:
            continue
        if real in links:
            try:
                command = Path(f"{entry.path}/comm").read_text().strip()
            except OSError:
                command = "?"
            out.append({"pid": int(entry.name), "command": command})
    return out


@dataclass(eq=False)
class PortRecord:
    """One open port's state, shared by its actor (which writes it) and the tools (which read it);
    it survives actor restarts, so a crash loses neither the URC buffer nor the owner."""

    key: str
    settings: PortSettings
    config: SerialConfig
    log_dir: Path
    opener: Opener
    run_blocking: BlockingRunner
    owner: str | None
    urc: UrcBuffer
    lines: dict[str, bool] = field(default_factory=dict)
    state: PortState = PortState.OPENING
    device: str | None = None
    log: RawLog | None = None
    log_path: Path | None = None
    opened_at: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    sessions: int = 0
    last_rx: float | None = None
    last_error: str | None = None

    def describe(self, viewer: str | None = None, *, owner_connected: bool = False) -> dict[str, Any]:
        state = self.state
        if state == PortState.CONNECTED and viewer and self.owner not in (None, viewer) and owner_connected:
            state = PortState.OCCUPIED
        return {
            "port": self.key, "device": self.device, "state": str(state), "owner": self.owner,
            "you_own": viewer is not None and self.owner == viewer,
            "settings": asdict(self.settings),
            "opened_at": iso(self.opened_at), "last_rx_at": iso(self.last_rx),
            "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
            "pending_urc_count": len(self.urc), "urc_dropped": self.urc.dropped,
            "urc_dropped_total": self.urc.dropped_total,
            "log_file": str(self.log_path) if self.log_path else None,
            "log_records": self.log.records if self.log else None,
            "log_unlogged_bytes": self.log.unlogged_bytes if self.log else 0,
            "last_error": self.last_error,
        }


@dataclass(eq=False)
class _Waiter:
    collector: ReplyCollector
    done: trio.Event = field(default_factory=trio.Event)
    first_record: int | None = None
    error: str | None = None


class SerialActor(Actor):
    kind = KIND
    # A crash reopens the port with the same settings; the URC buffer lives in the record.
    policy = SupervisionPolicy(restart=RestartKind.TRANSIENT, max_restarts=3, window_s=60, backoff_s=0.2,
                               stop_grace_s=2)

    def __init__(self, record: PortRecord) -> None:
        super().__init__(record.key, record)
        self.record = record
        self._io: PortIO | None = None
        self._nursery: trio.Nursery | None = None
        self._session: trio.CancelScope | None = None
        self._slicer = Slicer(record.settings.idle_ms / 1000, record.config.max_reply_bytes)
        self._waiter: _Waiter | None = None

    def __repr__(self) -> str:
        return f"<SerialActor [{self.record.key} {self.record.state}, urc: {len(self.record.urc)}]>"

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        await self._open_session(self.record.settings)

    async def handle(self, request: Request) -> dict[str, Any]:
        if request.op == "send":
            return await self._send(request.args)
        if request.op == "configure":
            return await self._configure(request.args["settings"], request.args["lines"])
        if request.op == "signals":
            return await self._signals(request.args)
        if request.op == "close":
            self._end_session("closed by request", PortState.CLOSED)
            return {"closed": True}
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown serial operation {request.op!r}")

    async def stop(self) -> None:
        self._end_session("actor stopped", PortState.CLOSED)

    def statistics(self) -> dict[str, Any]:
        rec = self.record
        return {"state": str(rec.state), "device": rec.device, "owner": rec.owner, "bytes_in": rec.bytes_in,
                "bytes_out": rec.bytes_out, "pending_urc_count": len(rec.urc),
                "urc_dropped_total": rec.urc.dropped_total, "log_file": str(rec.log_path) if rec.log_path else None}

    # -- sessions -----------------------------------------------------------------------------

    async def _open_session(self, settings: PortSettings) -> None:
        rec = self.record
        device = await rec.run_blocking(os.path.realpath, rec.key)
        io = await rec.opener(device, settings, rec.lines)
        header = {"port": rec.key, "device": device, "settings": asdict(settings), "pid": os.getpid()}
        try:
            log = await rec.run_blocking(partial(_new_log, rec, header))
        except OSError as exc:
            io.close()
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot create the raw log in {rec.log_dir}: {exc}",
                             port=rec.key) from None
        self._io, rec.log, rec.log_path, rec.device = io, log, log.path, device
        rec.settings, rec.state, rec.opened_at, rec.last_error = settings, PortState.CONNECTED, time.time(), None
        rec.sessions += 1
        self._slicer = Slicer(settings.idle_ms / 1000, rec.config.max_reply_bytes)
        self._session = trio.CancelScope()
        assert self._nursery is not None
        self._nursery.start_soon(self._read_loop, io, self._session)

    async def _read_loop(self, io: PortIO, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                with trio.move_on_at(self._slicer.deadline) as idle:
                    try:
                        data = await io.receive()
                    except PortGone as exc:
                        self._lost(io, str(exc))
                        return
                    self._received(data)
                if idle.cancelled_caught:  # an idle gap of idle_ms: the pending packet is complete
                    self._flush_packet()

    def _received(self, data: bytes) -> None:
        rec = self.record
        now, wall = trio.current_time(), time.time()
        index = rec.log.data("rx", data, wall) if rec.log else -1
        rec.bytes_in += len(data)
        rec.last_rx = wall
        waiter = self._waiter
        if waiter is not None and not waiter.done.is_set():
            if waiter.first_record is None:
                waiter.first_record = index
            data = waiter.collector.feed(data)
            if waiter.collector.matched is not None:
                waiter.done.set()
            if not data:
                return
        for packet in self._slicer.feed(data, now, wall):
            rec.urc.push(packet)

    def _flush_packet(self) -> None:
        if (packet := self._slicer.flush()) is not None:
            self.record.urc.push(packet)

    def _lost(self, io: PortIO, reason: str) -> None:
        if io is not self._io:
            return  # a previous session's late news
        self.record.last_error = f"device disconnected: {reason}"
        self._end_session(reason, PortState.DISCONNECTED)

    def _end_session(self, reason: str, state: PortState) -> None:
        rec = self.record
        if self._session is not None:
            self._session.cancel(reason=reason)
            self._session = None
        self._flush_packet()
        if self._waiter is not None:
            self._waiter.error = reason
            self._waiter.done.set()
        if rec.log is not None:
            wall = time.time()
            if state == PortState.DISCONNECTED:
                rec.log.event("disconnected", wall, reason=reason)
            rec.log.close(wall, reason=reason, bytes_in=rec.bytes_in, bytes_out=rec.bytes_out)
        io, self._io = self._io, None
        if io is not None:
            io.close()
        if rec.state in (PortState.CONNECTED, PortState.OPENING):
            rec.state = state

    def _require_connected(self) -> PortIO:
        rec = self.record
        if self._io is None or rec.state != PortState.CONNECTED:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                             f"{rec.key} is {rec.state}: {rec.last_error or 'not connected'}",
                             port=rec.key, state=str(rec.state), pending_urc_count=len(rec.urc),
                             hint="configure_connection(action='open') reopens it once the device is back")
        return self._io

    # -- operations ---------------------------------------------------------------------------

    async def _send(self, args: dict[str, Any]) -> dict[str, Any]:
        rec = self.record
        io = self._require_connected()
        payload: bytes = args["payload"]
        policy: str = args["wait_policy"]
        text_mode = args["text_patterns"]  # a CR/LF after a text pattern belongs to the reply
        patterns: dict[bytes, str] = args["patterns"]
        waiter = None
        if policy != "none":
            waiter = _Waiter(ReplyCollector(list(patterns), rec.config.max_reply_bytes, absorb_line_end=text_mode))
        t0 = trio.current_time()
        self._waiter = waiter
        completed = False
        try:
            sent = await self._write(io, payload)
            if waiter is not None:
                with trio.move_on_after(args["timeout_s"]):
                    await waiter.done.wait()
                if waiter.error is not None:
                    raise self._error_after(waiter, f"the port went away while waiting: {waiter.error}")
            completed = True
        finally:
            if self._waiter is waiter:
                self._waiter = None
            if waiter is not None and not completed and waiter.collector.total:
                # Failed or cancelled mid-reply: what arrived is not lost, it becomes a URC.
                rec.urc.push(Packet(bytes(waiter.collector.data), time.time(), t0, trio.current_time()))
        elapsed_ms = round((trio.current_time() - t0) * 1000, 3)
        collector = waiter.collector if waiter is not None else None
        raw = bytes(collector.data) if collector is not None else b""
        truncated = collector is not None and collector.truncated
        data, fmt = decode(raw, as_hex=args["as_hex"], cut=truncated)
        matched = collector.matched if collector is not None else None
        result: dict[str, Any] = {
            "success": True, "port": rec.key, "wait_policy": policy, "data": data, "format": fmt,
            "is_hex": fmt == "hex", "bytes_sent": sent, "bytes_received": collector.total if collector else 0,
            "found_keyword": matched is not None, "stop_pattern_matched": patterns.get(matched) if matched else None,
            "timed_out": policy == "keyword" and matched is None, "truncated": truncated,
            "pending_urc_count": len(rec.urc), "urc_dropped": rec.urc.dropped, "elapsed_ms": elapsed_ms,
            "log_offset": waiter.first_record if waiter is not None and (waiter.first_record or 0) >= 0 else None,
        }
        if truncated and collector is not None:
            result["note"] = (f"Output Truncated: the first {len(raw)} of {collector.total} bytes are shown; "
                              f"the whole reply is in the raw log (get_log offset={result['log_offset']})")
        return result

    def _error_after(self, waiter: _Waiter, message: str) -> DiagdError:
        rec = self.record
        received = waiter.collector.total
        if received:
            message += f" ({received} reply bytes received before it are in the URC buffer and the raw log)"
        return DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{rec.key}: {message}", port=rec.key,
                          state=str(rec.state), bytes_received=received,
                          hint="configure_connection(action='open') reopens it once the device is back")

    async def _write(self, io: PortIO, payload: bytes) -> int:
        rec = self.record
        view = memoryview(payload)
        written = 0
        limit_s = rec.config.write_timeout_ms / 1000
        with trio.move_on_after(limit_s) as stall:
            while written < len(payload):
                try:
                    n = await io.write_some(view[written:])
                except PortGone as exc:
                    self._lost(io, str(exc))
                    raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                                     f"{rec.key} is Disconnected: {rec.last_error or exc}",
                                     port=rec.key, state=str(rec.state), bytes_written=written,
                                     hint="configure_connection(action='open') reopens it once the device is back"
                                     ) from None
                if rec.log is not None:
                    rec.log.data("tx", bytes(view[written:written + n]), time.time())
                rec.bytes_out += n
                written += n
        if stall.cancelled_caught:
            raise DiagdError(ErrorCode.TIMEOUT, f"write to {rec.key} stalled: {written} of {len(payload)} bytes "
                             f"written in {limit_s:g} s (flow control holding it?)", port=rec.key,
                             bytes_written=written, bytes=len(payload))
        return written

    async def _configure(self, settings: PortSettings, lines: dict[str, bool]) -> dict[str, Any]:
        rec = self.record
        if rec.state != PortState.CONNECTED:
            rec.lines.update(lines)
            await self._open_session(settings)
            return {"reopened": True}
        io = self._require_connected()
        applied = False
        try:
            if settings != rec.settings:
                io.apply(settings)
                applied = True
            if lines:
                io.set_lines(lines.get("dtr"), lines.get("rts"))
        except SettingRefused as exc:  # apply() has put the port back: same session, old settings
            raise refused_error(rec.key, exc, f"the port keeps its settings ({_settings_text(rec.settings)})"
                                ) from None
        except ValueError as exc:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"invalid settings for {rec.key}: {exc}") from None
        except OSError as exc:
            if applied:  # the lines failed: a call that fails changes nothing, so the settings go back too
                with contextlib.suppress(OSError, ValueError, SettingRefused):
                    io.apply(rec.settings)
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot apply settings to {rec.key}: {exc}") from None
        rec.lines.update(lines)
        rec.settings = settings
        self._slicer.idle_s = settings.idle_ms / 1000
        if rec.log is not None:
            rec.log.event("settings", time.time(), settings=asdict(settings), **lines)
        return {"reopened": False}

    async def _signals(self, args: dict[str, Any]) -> dict[str, Any]:
        rec = self.record
        io = self._require_connected()
        dtr, rts, break_ms = args.get("dtr"), args.get("rts"), args.get("break_ms")
        try:
            io.set_lines(dtr, rts)
            if break_ms:
                io.set_break(True)
                try:
                    await trio.sleep(break_ms / 1000)
                finally:
                    io.set_break(False)
        except OSError as exc:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                             f"{rec.key} does not support this line control: {os.strerror(exc.errno or 0)}",
                             port=rec.key, errno=errno.errorcode.get(exc.errno or 0, "?")) from None
        if dtr is not None:
            rec.lines["dtr"] = dtr
        if rts is not None:
            rec.lines["rts"] = rts
        if rec.log is not None:
            rec.log.event("signals", time.time(), dtr=dtr, rts=rts, break_ms=break_ms)
        return {"success": True, "port": rec.key, "dtr": rec.lines.get("dtr"), "rts": rec.lines.get("rts"),
                "break_ms": break_ms, "modem_lines": io.modem_lines()}


def _settings_text(settings: PortSettings) -> str:
    """`115200 8N1`, plus flow control when on."""
    stop = f"{settings.stopbits:g}"
    flow = [name for name in ("rtscts", "xonxoff", "dsrdtr") if getattr(settings, name)]
    return f"{settings.baudrate} {settings.bytesize}{settings.parity}{stop}" + (f" {'+'.join(flow)}" if flow else "")


def session_logs(log_dir: Path, key: str) -> list[Path]:
    """This port's session logs, oldest first (exact names: another port's slug may extend ours)."""
    pattern = re.compile(re.escape(port_slug(key)) + r"-(\d{8}T\d{9}Z)(?:-(\d+))?\.jsonl")
    found = []
    for entry in os.scandir(log_dir) if log_dir.is_dir() else []:
        if m := pattern.fullmatch(entry.name):
            found.append(((m[1], int(m[2] or 0)), Path(entry.path)))
    return [path for _, path in sorted(found)]


def _new_log(rec: PortRecord, header: dict[str, Any]) -> RawLog:
    rec.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    slug = port_slug(rec.key)
    existing = session_logs(rec.log_dir, rec.key)
    for old in existing[: max(0, len(existing) - rec.config.log_keep + 1)]:
        old.unlink(missing_ok=True)
    wall = time.time()
    stamp = utc.compact(wall, digits=3)
    for n in range(1000):
        path = rec.log_dir / f"{slug}-{stamp}{'' if n == 0 else f'-{n}'}.jsonl"
        try:
            return RawLog(path, max_bytes=rec.config.log_max_bytes, header=header, wall=wall)
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot find a free log file name for {rec.key}")


def not_open_error(key: str, open_ports: list[str]) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"{key} is not open in diagd", port=key,
                      state=str(PortState.CLOSED), open_ports=open_ports,
                      hint="open it first with configure_connection(port, action='open')")


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


def register(runtime: Runtime) -> SerialBackend:
    backend = SerialBackend(runtime)
    for spec in backend.specs():
        runtime.register_tool(spec)
    return backend
