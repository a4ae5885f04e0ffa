"""A `sharkd -` worker: Wireshark's dissectors behind newline-delimited JSON-RPC on stdio.

One request at a time (the pcap actor serializes calls). Responses are matched by id, so a
late answer to an abandoned request is dropped instead of being taken for the next one; an
abandoned or timed-out request kills the worker (the only way to stop sharkd mid-request),
and the actor starts a fresh one on its next call.

A waiter reaps sharkd the moment it exits and closes its pipes. A worker that died (or is dying:
`kill -9` leaves a big sharkd running for a while) counts as not alive, so the next call starts a
fresh one instead of writing into a dead pipe; a request in flight when it dies fails with
BACKEND_UNAVAILABLE naming the signal.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from diagd.actors import system
from diagd.actors._subprocess import (
    TERM_THEN_KILL,
    Tail,
    chunks,
    close_pipes,
    describe_exit,
    drain,
    is_exiting,
    open_process,
    reap,
    stop_process,
)
from diagd.protocol.errors import DiagdError, ErrorCode

MAX_RESPONSE_BYTES = 256 * 1024 * 1024
MAX_REQUEST_BYTES = 2047  # sharkd 4.0 reads each request line into a 2 KiB buffer (plus the newline)


# Every error code of sharkd 4.0's sharkd_session.c, as the coded error diagd answers with. A request
# carries the caller's input (filter, field, frame number, follow spec, tap): sharkd refusing it is
# the caller's error, never a crashed actor. Codes this table does not know are INVALID_ARGUMENT too.
SHARKD_ERRORS: dict[int, tuple[ErrorCode, str]] = {
    -32600: (ErrorCode.INVALID_ARGUMENT, "request"),  # member type/value checks: frame=0, unknown member
    -32601: (ErrorCode.INTERNAL_ERROR, "method not supported"),
    -32603: (ErrorCode.BACKEND_UNAVAILABLE, "out of memory"),  # load
    -2001: (ErrorCode.INVALID_ARGUMENT, "capture cannot be opened"),  # load
    -3001: (ErrorCode.INVALID_ARGUMENT, "frame number"),  # setcomment
    -3002: (ErrorCode.INVALID_ARGUMENT, "frame number out of range"),
    -3003: (ErrorCode.INVALID_ARGUMENT, "comment"),
    -4001: (ErrorCode.INVALID_ARGUMENT, "preference name missing"),  # setconf
    -4002: (ErrorCode.INVALID_ARGUMENT, "preference value missing"),
    -4003: (ErrorCode.INVALID_ARGUMENT, "preference obsolete"),
    -4004: (ErrorCode.INVALID_ARGUMENT, "no such preference"),
    -4005: (ErrorCode.INVALID_ARGUMENT, "preference value refused"),
    -5001: (ErrorCode.INVALID_FILTER, "display filter"),  # check filter
    -5002: (ErrorCode.INVALID_FIELDS, "field"),  # check field
    -6001: (ErrorCode.INVALID_ARGUMENT, "io graph"),  # iograph: field unit or filter
    -7001: (ErrorCode.INVALID_FILTER, "display filter"),  # intervals
    -8001: (ErrorCode.INVALID_ARGUMENT, "ref_frame"),  # frame
    -8002: (ErrorCode.INVALID_ARGUMENT, "prev_frame"),
    -8003: (ErrorCode.INVALID_ARGUMENT, "frame"),  # out of range, or a read error
    -9001: (ErrorCode.INVALID_ARGUMENT, "preference"),  # dumpconf
    -9002: (ErrorCode.INVALID_ARGUMENT, "preference module"),
    -10001: (ErrorCode.INVALID_ARGUMENT, "download token"),  # download
    -10002: (ErrorCode.INVALID_ARGUMENT, "download"),
    **{code: (ErrorCode.INVALID_ARGUMENT, "tap") for code in range(-11012, -11000)},  # tap not found
    -11013: (ErrorCode.INVALID_FILTER, "tap filter"),  # register_tap_listener refused the tap's filter
    -12001: (ErrorCode.INVALID_ARGUMENT, "follower"),  # follow
    -12002: (ErrorCode.INVALID_FILTER, "follow filter"),
    -13001: (ErrorCode.INVALID_ARGUMENT, "column definition"),  # frames
    -13002: (ErrorCode.INVALID_FILTER, "display filter"),
}
_FLAGS = frozenset({"proto", "bytes", "columns", "color", "hidden"})  # what to answer with, not input


@dataclass(frozen=True)
class Cut:
    """An answer read in part, as its call's `keep` asked: the first bytes of its JSON line (as text) and the size of
    the whole line, whose rest was read off the pipe and dropped as it came, never kept or parsed."""

    text: str
    answer_bytes: int


_ID = re.compile(rb'^\{"jsonrpc":"2\.0","id":(\d+)')
_HEAD = 64  # bytes enough to read a response line's id


class ResponseLines:
    """sharkd's stdout cut into lines (without the newline). A line answering a request that asked to keep part of
    its answer (`caps`: request id -> bytes) keeps its first bytes only: the rest is counted and dropped as it
    arrives, so a large answer never sits in memory whole; any other line keeps at most `max_line` bytes so."""

    def __init__(self, caps: dict[int, int], max_line: int) -> None:
        self._caps = caps
        self._max_line = max_line
        self._buffer = bytearray()
        self._cap: int | None = None  # the current line's, once its head is read
        self._dropped = 0

    def split(self, data: bytes | bytearray) -> list[tuple[bytes, int]]:
        """(its kept bytes, the whole line's size) of each line `data` completes."""
        lines = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            self._add(data[start:] if end < 0 else data[start:end])
            if end < 0:
                break
            lines.append((bytes(self._buffer), len(self._buffer) + self._dropped))
            self._buffer.clear()
            self._cap, self._dropped = None, 0
            start = end + 1
        return lines

    def _add(self, piece: bytes | bytearray) -> None:
        if self._cap is None:
            self._buffer += piece
            if len(self._buffer) < _HEAD:
                return
            found = _ID.match(self._buffer)
            self._cap = self._caps.get(int(found.group(1)), self._max_line) if found else self._max_line
            over = len(self._buffer) - self._cap
            if over > 0:
                del self._buffer[self._cap:]
                self._dropped += over
            return
        room = max(0, self._cap - len(self._buffer))
        self._buffer += piece[:room]
        self._dropped += len(piece) - min(room, len(piece))


class SharkdError(DiagdError):
    """sharkd answered a request with a JSON-RPC error: a coded DiagdError (SHARKD_ERRORS) naming the
    request's input and sharkd's message, so one that no caller maps never crashes the actor.

    `sharkd_code` and `sharkd_message` are sharkd's own; `message` is what the caller is told.
    """

    def __init__(self, code: int, message: str, method: str = "", params: dict[str, Any] | None = None) -> None:
        coded, what = SHARKD_ERRORS.get(code, (ErrorCode.INVALID_ARGUMENT, "request"))
        inputs = {k: v for k, v in (params or {}).items() if k not in _FLAGS}
        shown = "; ".join([what, *(f"{k}={str(v)[:200]!r}" for k, v in inputs.items())])
        super().__init__(coded, f"sharkd refused {method or 'the request'} ({shown}): {message}",
                         sharkd_code=code, sharkd_message=message, sharkd_method=method, **_details(inputs))
        self.sharkd_code = code
        self.sharkd_message = message


def _details(inputs: dict[str, Any]) -> dict[str, Any]:
    """The request's inputs as error details (a filter is `display_filter`, as everywhere else)."""
    return {"display_filter" if k == "filter" else k: str(v)[:500] for k, v in inputs.items()}


class SharkdProcess(Protocol):
    """What the worker pool uses of a sharkd (`Sharkd`; tests/support/fake_sharkd.py scripts one)."""

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int: ...

    @property
    def requests(self) -> int: ...

    def rss_bytes(self) -> int | None: ...

    async def load(self, path: str) -> tuple[int, str | None]: ...

    async def call(self, method: str, params: dict[str, Any] | None = None, *, keep: int | None = None) -> Any: ...

    async def call_many(self, method: str, params: list[dict[str, Any]]) -> list[Any]: ...

    async def close(self) -> str: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class Sharkd:
    """One `sharkd -` process: requests written as JSON lines, answers routed back by id."""

    def __init__(self, proc: trio.Process, config_dir: Path) -> None:
        self.proc = proc
        self.config_dir = config_dir
        self.stderr = Tail()
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self._caps: dict[int, int] = {}  # request id -> the bytes of its answer to keep (a Cut past them)
        self._dead = trio.Event()
        self.exited = trio.Event()  # reaped; `exit_code` is set
        self.exit_code: int | None = None
        self._stdout_eof = trio.Event()
        self._stderr_eof = trio.Event()
        self.requests = 0
        self.paused = False

    @classmethod
    async def start(cls, nursery: trio.Nursery, config_dir: Path) -> Sharkd:
        binary = shutil.which("sharkd")
        if binary is None:
            raise DiagdError(ErrorCode.TSHARK_NOT_FOUND, "sharkd is not installed",
                             fix="apt-get install wireshark-common (scripts/setup.sh does it)")
        env = {**os.environ, "WIRESHARK_CONFIG_DIR": str(config_dir)}
        # Stoppable: a background pass yields its core to calls (pause); a stopped sharkd must still
        # end with the daemon.
        proc = await open_process([binary, "-"], stdin=subprocess.PIPE, env=env, stoppable=True)
        worker = cls(proc, config_dir)
        nursery.start_soon(worker._read_responses)
        nursery.start_soon(drain, proc.stderr, worker.stderr.feed, worker._stderr_eof)
        nursery.start_soon(worker._wait)
        return worker

    async def _wait(self) -> None:
        self.exit_code = await reap(self.proc, readers_done=(self._stdout_eof, self._stderr_eof))
        self._dead.set()
        self.exited.set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return not self._dead.is_set() and self.proc.returncode is None and not is_exiting(self.proc.pid)

    async def death(self) -> str:
        """How the worker ended, waiting briefly for the waiter to reap it ("killed by SIGKILL")."""
        with trio.move_on_after(2.0):
            await self.exited.wait()
        return describe_exit(self.exit_code if self.exit_code is not None else self.proc.returncode)

    def rss_bytes(self) -> int | None:
        return system.rss_bytes(self.proc.pid)

    async def _read_responses(self) -> None:
        # Read here, not through a callback: an answer goes from the reader to its waiter without
        # this module being called back from the subprocess helpers.
        lines = ResponseLines(self._caps, MAX_RESPONSE_BYTES)
        try:
            try:
                async with aclosing(chunks(self.proc.stdout)) as received:
                    async for chunk in received:
                        for line, size in lines.split(chunk):
                            self._on_line(line, size)
            finally:
                self._stdout_eof.set()
        finally:
            self._dead.set()
            for channel in self._waiting.values():
                channel.close()
            self._waiting.clear()

    def _on_line(self, line: bytes, size: int) -> None:
        """Route one line of sharkd's stdout to the request waiting for it (other lines are noise). A line cut at
        its request's `keep` is its Cut; one cut at MAX_RESPONSE_BYTES unasked, an error of that request."""
        if not line.startswith(b"{"):
            return
        if size > len(line):
            found = _ID.match(line)
            request_id = int(found.group(1)) if found else None
            kept = self._caps.pop(request_id, None) if request_id is not None else None
            cut = self._waiting.pop(request_id, None) if request_id is not None else None
            if cut is not None:
                cut.send_nowait({"id": request_id, "cut": Cut(line.decode(errors="replace"), size)} if kept else
                                {"id": request_id, "error": {"code": -32603, "message": (
                                    f"an answer of {size} bytes, over the {MAX_RESPONSE_BYTES} diagd reads")}})
            return
        try:
            message = json.loads(line)
        except ValueError:
            return
        self._caps.pop(message.get("id"), None)
        channel = self._waiting.pop(message.get("id"), None)
        if channel is None and "error" in message and len(self._waiting) == 1:
            # sharkd answers a request it could not parse under a stale id; it handles one
            # request at a time, so the error belongs to the one in flight.
            channel = self._waiting.pop(next(iter(self._waiting)))
        if channel is not None:
            channel.send_nowait(message)

    async def load(self, path: str) -> tuple[int, str | None]:
        """Load a capture; returns (frame count, sharkd's complaint such as a truncated last packet).

        sharkd 4.0 never answers `load` when the file ends mid-packet (it only prints to stderr),
        so a `status` request is queued behind it: its answer means the load is over.
        """
        load_id, load_reply = await self._send("load", {"file": path})
        status = await self.call("status")
        try:
            message = load_reply.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            self._waiting.pop(load_id, None)
            text = self.stderr.text()
            complaint = [line for line in text.splitlines() if line.startswith("sharkd: ")]
            frames = int(status.get("frames", 0))
            return frames, complaint[-1].removeprefix("sharkd: ") if complaint else "sharkd did not confirm the load"
        if "error" in message:
            complaint = [line for line in self.stderr.text().splitlines() if line.startswith("sharkd: ")]
            reason = f" ({complaint[-1].removeprefix('sharkd: ')})" if complaint else ""
            raise SharkdError(int(message["error"].get("code", 0)), str(message["error"].get("message", "")) + reason,
                              "load", {"file": path})
        frames = int(status.get("frames", 0))
        return frames, None if frames else "the capture holds no frames"

    async def _send(self, method: str, params: dict[str, Any] | None, keep: int | None = None
                    ) -> tuple[int, trio.MemoryReceiveChannel[dict[str, Any]]]:
        await self._check_alive()
        request_id = next(self._ids)
        line = _request_line(method, params, request_id)
        receive = self._expect(request_id, keep)
        await self._write(line, 1)
        return request_id, receive

    async def _check_alive(self) -> None:
        if not self.alive:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"sharkd is not running ({await self.death()})",
                             stderr=self.stderr.text()[-2000:])

    def _expect(self, request_id: int, keep: int | None) -> trio.MemoryReceiveChannel[dict[str, Any]]:
        """The channel the answer to `request_id` comes on."""
        send, receive = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[request_id] = send
        if keep is not None:
            self._caps[request_id] = keep
        return receive

    async def _write(self, data: bytes, requests: int) -> None:
        assert self.proc.stdin is not None
        self.requests += requests
        try:
            await self.proc.stdin.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # it died: the reader closes the reply channel and call() says how

    async def call(self, method: str, params: dict[str, Any] | None = None, *, keep: int | None = None) -> Any:
        """One request; its result, or SharkdError when sharkd answered with an error. With `keep`, an answer
        longer than `keep` bytes is its Cut: only its first `keep` bytes are read into memory."""
        answer = (await self.call_many(method, [params or {}], keep=keep))[0]
        if isinstance(answer, SharkdError):
            raise answer
        return answer

    async def call_many(self, method: str, params: list[dict[str, Any]], *, keep: int | None = None) -> list[Any]:
        """The same request for many parameter sets, pipelined: all are written before the first
        answer is read (sharkd answers them in order), so a page of 500 frames costs 500 dissections,
        not 500 round trips. Each answer is the result (a Cut past `keep` bytes), or the SharkdError of
        that request."""
        sent: list[tuple[int, trio.MemoryReceiveChannel[dict[str, Any]]]] = []
        answers: list[Any] = []
        # One check that sharkd lives and one write for all of them: a check (two /proc reads) and a
        # write per request took ~18 ms of the ~120 ms a 200-frame page's trees take.
        await self._check_alive()
        ids = [next(self._ids) for _ in params]
        lines = [_request_line(method, one, request_id) for one, request_id in zip(params, ids, strict=True)]
        try:
            for request_id in ids:
                sent.append((request_id, self._expect(request_id, keep)))
            await self._write(b"".join(lines), len(lines))
            for _, receive in sent:
                try:
                    message = await receive.receive()
                except trio.EndOfChannel:
                    how = await self.death()
                    raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"sharkd died during {method!r} ({how}); "
                                     "the next call starts a fresh one", exit=how,
                                     stderr=self.stderr.text()[-2000:]) from None
                answers.append(_answer(message, method, params[len(answers)]))
        except BaseException:
            abandoned = [self._waiting.pop(request_id, None) for request_id, _ in sent]
            for request_id, _ in sent:
                self._caps.pop(request_id, None)
            if any(channel is not None for channel in abandoned):
                await self.kill()  # abandoned mid-request: sharkd cannot be interrupted otherwise
            raise
        return answers

    async def kill(self) -> None:
        self._dead.set()
        await self.close()

    def pause(self) -> None:
        """Stop the process where it is (SIGSTOP): a background pass yielding its core to a call.
        The request under way goes on after `resume`; sharkd sees nothing of it."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """Let a paused process go on (SIGCONT); harmless when it is not paused."""
        if self.paused:
            self.paused = False
            self._signal(signal.SIGCONT)

    def _signal(self, signum: signal.Signals) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signum)

    async def close(self) -> str:
        self.resume()  # a stopped process would hold SIGTERM until the escalation's SIGKILL
        step = await stop_process(self.proc, TERM_THEN_KILL)
        await close_pipes(self.proc)
        return step


def _request_line(method: str, params: dict[str, Any] | None, request_id: int) -> bytes:
    """A request as sharkd reads it: one JSON line, at most MAX_REQUEST_BYTES before its newline."""
    line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}})
    if len(line) >= MAX_REQUEST_BYTES:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"request of {len(line)} bytes: sharkd 4.0 reads at most {MAX_REQUEST_BYTES} per request",
                         method=method)
    return line.encode() + b"\n"


def _answer(message: dict[str, Any], method: str, params: dict[str, Any]) -> Any:
    """A response's result, or the SharkdError of its JSON-RPC error (a malformed error object too)."""
    if "cut" in message:
        return message["cut"]
    error = message.get("error")
    if error is None:
        return message.get("result")
    if not isinstance(error, dict):
        return SharkdError(0, f"malformed error {str(error)[:200]!r}", method, params)
    try:
        code = int(error.get("code", 0))
    except (TypeError, ValueError):
        code = 0
    return SharkdError(code, str(error.get("message", "")), method, params)
