"""One actor per open port: it owns the port, its reader task, the idle slicer, the URC buffer and
the raw log (see `diagd.actors.serial`)."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import trio

from diagd.actors.base import Actor, Request, RestartKind, SupervisionPolicy, unhandled
from diagd.actors.serial.codec import Packet, ReplyCollector, Slicer, decode
from diagd.actors.serial.messages import Close, Configure, ReadUrc, Send, Signals
from diagd.actors.serial.port import PortGone, PortIO, SettingRefused, refused_error
from diagd.actors.serial.rawlog import new_log
from diagd.actors.serial.record import PortRecord
from diagd.actors.serial.replies import ReadUrcReply, SendReply, SignalsReply
from diagd.actors.serial.settings import LINE_ENDINGS, PortSettings, PortState
from diagd.protocol.errors import DiagdError, ErrorCode

KIND = "serial"


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
        rec = self.record
        match request.message:
            case Send() as send:
                self._authorize(send.client)
                return send.reply(await self._send(send))
            case Configure() as configure:
                took_over = self._authorize(configure.client, force=configure.force)
                reopened = await self._configure(replace(rec.settings, **configure.given), configure.lines)
                return configure.reply({"reopened": reopened, "took_over_from": took_over})
            case Signals() as signals:
                self._authorize(signals.client)
                return signals.reply(await self._signals(signals))
            case ReadUrc() as read:
                if not read.peek:
                    self._authorize(read.client)
                return read.reply(self._read_urc(read))
            case Close() as close:
                took_over = self._authorize(close.client, force=close.force)
                self._end_session("closed by request", PortState.CLOSED)
                return close.reply({"took_over_from": took_over, "discarded_urc_packets": len(rec.urc)})
        raise unhandled("serial", request)

    def _authorize(self, client: str, *, force: bool = False) -> str | None:
        """Let `client` act on the port; returns the previous owner when it takes the port over."""
        rec = self.record
        owner = rec.owner
        if owner == client:
            return None
        if owner is None or force or not rec.owner_connected(owner):
            rec.owner = client
            if rec.log is not None:
                rec.log.event("owner", time.time(), owner=client, previous=owner, forced=force)
            return owner
        raise DiagdError(ErrorCode.BUSY, f"{rec.key} is Occupied: held by another diagd client ({owner})",
                         port=rec.key, state=str(PortState.OCCUPIED), owner=owner,
                         hint="configure_connection(port, action='open', force=true) takes it over")

    def _read_urc(self, read: ReadUrc) -> ReadUrcReply:
        rec = self.record
        packets, dropped = rec.urc.take(read.max_packets, 4 * rec.config.max_reply_bytes, peek=read.peek)
        # pending_urc_count is what the buffer holds after this call, as in send_data and
        # connection_status: after a peek, the packets shown are still pending.
        pending = len(rec.urc)
        return {"port": rec.key, "state": rec.state,
                "packets": [p.to_json(as_hex=read.as_hex) for p in packets],
                "returned": len(packets), "pending_urc_count": pending,
                "has_more": pending > (len(packets) if read.peek else 0),
                "dropped": dropped, "dropped_total": rec.urc.dropped_total}

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
            log = await rec.run_blocking(partial(new_log, rec.log_dir, rec.key, rec.config, header))
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

    async def _send(self, send: Send) -> SendReply:
        rec = self.record
        io = self._require_connected()
        line_ending = send.line_ending or rec.settings.line_ending
        payload = send.payload + LINE_ENDINGS[line_ending]
        policy, patterns = send.wait_policy, send.patterns
        waiter = None
        if policy != "none":
            reply = ReplyCollector(list(patterns), rec.config.max_reply_bytes, absorb_line_end=send.text_patterns)
            waiter = _Waiter(reply)
        t0 = trio.current_time()
        self._waiter = waiter
        completed = False
        try:
            sent = await self._write(io, payload)
            if waiter is not None:
                with trio.move_on_after(send.timeout_s):
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
        data, fmt = decode(raw, as_hex=send.as_hex, cut=truncated)
        matched = collector.matched if collector is not None else None
        timed_out = policy == "keyword" and matched is None
        result: SendReply = {
            "success": not timed_out, "port": rec.key, "wait_policy": policy, "data": data, "format": fmt,
            "is_hex": fmt == "hex", "bytes_sent": sent, "bytes_received": collector.total if collector else 0,
            "found_keyword": matched is not None, "stop_pattern_matched": patterns.get(matched) if matched else None,
            "timed_out": timed_out, "truncated": truncated,
            "pending_urc_count": len(rec.urc), "urc_dropped": rec.urc.dropped, "elapsed_ms": elapsed_ms,
            "log_offset": waiter.first_record if waiter is not None and (waiter.first_record or 0) >= 0 else None,
        }
        if timed_out:
            result["reason"] = _no_keyword(send, line_ending, collector.total if collector else 0)
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

    async def _configure(self, settings: PortSettings, lines: dict[str, bool]) -> bool:
        """Apply `settings` and `lines` to the open port, or reopen it with them; True if reopened."""
        rec = self.record
        if rec.state != PortState.CONNECTED:
            rec.lines.update(lines)
            await self._open_session(settings)
            return True
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
        return False

    async def _signals(self, signals: Signals) -> SignalsReply:
        rec = self.record
        io = self._require_connected()
        dtr, rts, break_ms = signals.dtr, signals.rts, signals.break_ms
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


def _no_keyword(send: Send, line_ending: str, received: int) -> str:
    """Why a keyword wait failed: which patterns, how long, how much came, and the likely cause."""
    why = (f"no stop_pattern ({', '.join(repr(p) for p in send.patterns.values())}) came within "
           f"{send.timeout_s * 1000:g} ms; {received} bytes came" + (" (in data)" if received else ""))
    if not received and send.payload and line_ending == "none":
        why += "; the payload went out with no line ending (line_ending='none'): AT commands need 'cr'"
    return why


def _settings_text(settings: PortSettings) -> str:
    """`115200 8N1`, plus flow control when on."""
    stop = f"{settings.stopbits:g}"
    flow = [name for name in ("rtscts", "xonxoff", "dsrdtr") if getattr(settings, name)]
    return f"{settings.baudrate} {settings.bytesize}{settings.parity}{stop}" + (f" {'+'.join(flow)}" if flow else "")




def not_open_error(key: str, open_ports: list[str]) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"{key} is not open in diagd", port=key,
                      state=str(PortState.CLOSED), open_ports=open_ports,
                      hint="open it first with configure_connection(port, action='open')")
