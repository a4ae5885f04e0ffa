"""Child processes owned by actors: started in their own process group, always drained, and
stopped in named, bounded escalation steps (graceful -> SIGTERM to the group -> SIGKILL).

Every actor that runs a tool (sharkd, bpftrace, crash, the drgn worker) goes through here, so
no child outlives its actor and no full pipe ever blocks a child. Every child also gets a waiter
(`reap`): it is reaped the moment it exits (never `<defunct>` until someone next looks) and its
pipes are closed then, not when the garbage collector gets to them. Short commands that run to
completion (`tshark -G`, `capinfos`, `crash --version`, `bpftrace -l`) go through `run`: bounded
output, an optional timeout, the same stop escalation when it passes or the caller is cancelled.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import signal
import subprocess
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from diagd.actors.base import sole_exception
from diagd.protocol.errors import DiagdError, ErrorCode


@dataclass(frozen=True)
class Step:
    name: str
    signal: int | None  # None: the caller's graceful action only (e.g. writing "quit")
    wait_s: float


PIPE_EOF_GRACE_S = 2.0  # after exit, how long readers may take to reach EOF before the pipes are closed
_PF_EXITING = 0x4  # include/linux/sched.h: the task is in do_exit()
_PF_SIGNALED = 0x400  # include/linux/sched.h: get_signal() took a fatal signal (before PF_EXITING)
_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)

GRACEFUL_INT = (Step("sigint", signal.SIGINT, 3.0), Step("sigterm", signal.SIGTERM, 2.0),
                Step("sigkill", signal.SIGKILL, 5.0))
TERM_THEN_KILL = (Step("sigterm", signal.SIGTERM, 2.0), Step("sigkill", signal.SIGKILL, 5.0))
# A `head` stopped early has had all it asks for, and reads a file into a pipe: nothing of its state
# is worth a graceful exit, and TERM would have tshark tear its dissectors down (~20 ms measured)
# before the answer goes.
HEAD_STOP = (Step("sigkill", signal.SIGKILL, 5.0),)
STDERR_AFTER_EXIT_S = 1.0  # how long `head` reads a command's stderr after it exited (a child may hold it)


def default_signals() -> None:
    """In the child, before exec: SIGINT/SIGQUIT back to their defaults.

    A process started from a shell's background job inherits SIGINT *ignored*, and exec keeps an
    ignored signal ignored; the graceful first step of every escalation is SIGINT (bpftrace prints
    its maps, crash stops a command), so the child must not inherit that.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


async def open_process(argv: Sequence[str], *, stdin: int | None = subprocess.DEVNULL,
                       env: dict[str, str] | None = None, cwd: str | None = None,
                       stoppable: bool = False) -> trio.Process:
    """Start argv (no shell) in a new session with piped stdout/stderr and default signals.

    `stoppable`: a child the daemon may stop (SIGSTOP) goes in a process group of its own in the
    daemon's session instead: should the daemon die while the child is stopped, the kernel finds that
    group orphaned with a stopped member and sends it SIGHUP then SIGCONT (kernel/exit.c,
    kill_orphaned_pgrp), so it ends instead of waiting stopped forever. In a session of its own the
    kernel would not (and PR_SET_PDEATHSIG is no way out: Trio forks from a worker thread, whose exit fires it)."""
    # A preexec_fn forces fork() of this whole process instead of vfork (~10 ms for the daemon):
    # only pay it when SIGINT is really ignored here (started from a background job).
    inherited_ignore = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    group: dict[str, Any] = {"process_group": 0} if stoppable else {"start_new_session": True}
    return await trio.lowlevel.open_process(
        list(argv), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, cwd=cwd, preexec_fn=default_signals if inherited_ignore else None, **group,
    )


def _signal_group(proc: trio.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the whole group: helpers the tool spawned go too
    except (ProcessLookupError, PermissionError):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


async def stop_process(proc: trio.Process, steps: Sequence[Step] = TERM_THEN_KILL,
                       graceful: Callable[[], Awaitable[None]] | None = None) -> str:
    """Stop `proc`, escalating step by step; return the name of the step that ended it.

    Runs shielded: stopping must finish even when the actor that owns the child is cancelled.
    """
    with trio.CancelScope(shield=True):
        if proc.returncode is not None:
            return "exited"
        for step in steps:
            if step.signal is None:
                if graceful is not None:
                    with trio.move_on_after(step.wait_s):
                        await graceful()
            else:
                _signal_group(proc, step.signal)
            with trio.move_on_after(step.wait_s):
                await proc.wait()
                return step.name
        return "unreaped"
    return "unreaped"  # unreachable: mypy cannot see that a shielded scope never swallows the loop


async def close_pipes(proc: trio.Process) -> None:
    """Close our ends of the child's pipes now (a blocked reader gets ClosedResourceError)."""
    with trio.CancelScope(shield=True):
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                await stream.aclose()


async def reap(proc: trio.Process, *, readers_done: Sequence[trio.Event] = (),
               eof_grace_s: float = PIPE_EOF_GRACE_S) -> int:
    """The waiter every child gets: reap `proc` as soon as it exits, then close its pipes.

    The readers get `eof_grace_s` to take what the child wrote before it died (their `done`
    events); after that the pipes are closed anyway, since a grandchild may still hold the
    write ends. Cancelled (the owner is stopping it), it leaves the pipes to the owner, whose
    graceful stop step may still need stdin.
    """
    code = await proc.wait()
    with trio.move_on_after(eof_grace_s):
        for done in readers_done:
            await done.wait()
    await close_pipes(proc)
    return code


def describe_exit(code: int | None) -> str:
    """A return code in words: "exited with status 1", "killed by SIGKILL", "still running"."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def is_exiting(pid: int) -> bool:
    """True when the process is already on its way out though not yet reapable.

    After `kill -9` a big process stays in state R for a while, tearing down its memory; a request
    written to it then is lost. /proc shows it at once: SIGKILL in the shared pending set
    (`ShdPnd` of /proc/<pid>/status, from kill() until the process is released; /proc/<pid>/stat's
    field 31 holds only the thread's own set, which the dying thread empties before it flags
    itself: a read in between, seen 1 run in ~70 on kernel 6.18, took a killed process for alive),
    then PF_SIGNALED / PF_EXITING in the flags (field 9 of stat), then state Z/X.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = dict(line.split(b":\t", 1) for line in f.read().splitlines() if b":\t" in line)
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    fields = stat[stat.rindex(b")") + 2:].split()
    try:
        state, flags = fields[0], int(fields[6])
        pending = int(status.get(b"ShdPnd", b"0"), 16) | int(status.get(b"SigPnd", b"0"), 16)
    except (IndexError, ValueError):
        return False
    return state in (b"Z", b"X") or bool(flags & (_PF_EXITING | _PF_SIGNALED)) or bool(pending & _SIGKILL_BIT)


class Tail:
    """The last `limit` bytes of a stream (stderr for error messages), decoded on demand."""

    def __init__(self, limit: int = 16384) -> None:
        self.limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def feed(self, data: bytes | bytearray) -> None:
        self._chunks.append(bytes(data))
        self._size += len(data)
        while len(self._chunks) > 1 and self._size - len(self._chunks[0]) >= self.limit:  # keep `limit` bytes
            self._size -= len(self._chunks.popleft())

    def text(self) -> str:
        return b"".join(self._chunks)[-self.limit:].decode(errors="replace")


async def drain(stream: trio.abc.ReceiveStream | None, sink: Callable[[bytes | bytearray], None],
                done: trio.Event | None = None) -> None:
    """Read `stream` to EOF, handing every chunk to `sink` (never let a pipe fill up); then set `done`."""
    try:
        async with aclosing(chunks(stream)) as received:
            async for chunk in received:
                sink(chunk)
    finally:
        if done is not None:
            done.set()


async def chunks(stream: trio.abc.ReceiveStream | None) -> AsyncGenerator[bytes | bytearray, None]:
    """The chunks `stream` gives until EOF (or until it breaks or is closed): for a reader that
    handles them itself rather than through a callback (use with `contextlib.aclosing`)."""
    if stream is None:
        return
    try:
        while chunk := await stream.receive_some(65536):
            yield chunk
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


class LineSplitter:
    """Turns chunks into complete lines (without the newline): returned by `split`, or handed to
    `on_line` by `feed`; `flush()` at EOF."""

    def __init__(self, on_line: Callable[[str], None] = lambda line: None, max_line: int = 1 << 20) -> None:
        self._on_line = on_line
        self._buffer = bytearray()
        self._max_line = max_line

    def split(self, data: bytes | bytearray) -> list[str]:
        """The lines `data` completes (a runaway line longer than max_line: what there is of it)."""
        block = self.split_text(data)
        return [] if block is None else block.split("\n")

    def split_text(self, data: bytes | bytearray) -> str | None:
        """The lines `data` completes joined by "\n", as `split` gives them (None: no line yet)."""
        self._buffer += data
        block = None
        end = self._buffer.rfind(b"\n")
        if end >= 0:
            # All complete lines at once (not a cut of the buffer's head per line: that moves the rest
            # of a 64 KiB chunk for every line of it). Decoding them together gives what decoding each
            # would: a newline is never part of a UTF-8 sequence.
            complete = bytes(self._buffer[:end])
            del self._buffer[:end + 1]
            block = complete.decode(errors="replace")
            if "\r" in block:  # rare (tshark, bpftrace and crash end lines with "\n"): no pass over every line
                block = "\n".join(line.rstrip("\r") for line in block.split("\n"))
        if len(self._buffer) > self._max_line:  # a runaway line: emit what we have
            taken = self._take()
            block = taken if block is None else f"{block}\n{taken}"
        return block

    def feed(self, data: bytes | bytearray) -> None:
        for line in self.split(data):
            self._on_line(line)

    def flush(self) -> None:
        for line in self.rest():
            self._on_line(line)

    def rest(self) -> list[str]:
        """The last line when the data ended without a newline (at EOF), as `split` gives lines."""
        return [self._take()] if self._buffer else []

    def _take(self) -> str:
        line = bytes(self._buffer).decode(errors="replace").rstrip("\r")
        self._buffer.clear()
        return line


# ---------------------------------------------------------------------------------------------
# Commands run to completion


class Spawn(Protocol):
    """Starts a process (`open_process`; scripted fakes in tests)."""

    def __call__(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Awaitable[trio.Process]: ...


MAX_OUTPUT_BYTES = 256 * 1024 * 1024  # what a short command may print before it is stopped
STDERR_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class Completed:
    returncode: int  # negative: killed by that signal
    stdout: bytes
    stderr: str  # its last STDERR_TAIL_BYTES, decoded

    @property
    def out(self) -> str:
        return self.stdout.decode(errors="replace")


async def run(argv: Sequence[str], *, timeout_s: float | None = None, max_output_bytes: int = MAX_OUTPUT_BYTES,
              env: dict[str, str] | None = None, spawn: Spawn = open_process, steps: Sequence[Step] = TERM_THEN_KILL,
              fix: str = "") -> Completed:
    """Run `argv` (no shell, its own process group, stdin /dev/null) to completion.

    Coded errors: BACKEND_UNAVAILABLE when it cannot start (`fix` says how to install it), TIMEOUT
    past `timeout_s`, OUTPUT_TOO_LARGE past `max_output_bytes` of stdout. In every case, and when the
    caller is cancelled, the child is stopped by `steps` (its whole group) and reaped.
    """
    try:
        proc = await spawn(argv, env=env)
    except OSError as exc:
        details = {"fix": fix} if fix else {}
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{argv[0]} cannot run: {exc.strerror or exc}",
                         command=argv[0], **details) from None
    out, err = bytearray(), Tail(STDERR_TAIL_BYTES)

    def collect(chunk: bytes | bytearray) -> None:
        out.extend(chunk)
        if len(out) > max_output_bytes:
            raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE, f"{argv[0]} printed more than {max_output_bytes} bytes",
                             command=argv[0], max_output_bytes=max_output_bytes)

    try:
        with trio.fail_after(timeout_s if timeout_s is not None else math.inf):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain, proc.stdout, collect)
                nursery.start_soon(drain, proc.stderr, err.feed)
                await proc.wait()
    except trio.TooSlowError:
        raise DiagdError(ErrorCode.TIMEOUT, f"{shlex.join(argv)[:200]} did not finish within {timeout_s:g} s",
                         command=argv[0], timeout_s=timeout_s) from None
    except BaseExceptionGroup as group:  # collect's OUTPUT_TOO_LARGE, from inside the nursery
        raise sole_exception(group) from None
    finally:
        await stop_process(proc, steps)
        await close_pipes(proc)
    return Completed(-1 if proc.returncode is None else proc.returncode, bytes(out), err.text())



@dataclass(frozen=True)
class Head:
    lines: list[str]  # without `records`; with them [] (the records are in `text`)
    stopped: bool  # stopped once `limit` lines were in; False: it ended by itself (all lines are here)
    returncode: int | None
    stderr: str  # its last STDERR_TAIL_BYTES
    text: str = ""  # with `records`: the first `limit` records as printed (their lines joined by "\n")


# What runs a command for `head`'s answer: `head` itself, or one that hands it to a process started
# ahead of need (the pcap back end's warm tshark). (argv, limit, *, max_line, records) -> Head.
RunHead = Callable[..., Awaitable[Head]]


async def head(argv: Sequence[str], limit: int | None, *, max_line: int = 1 << 20,
               on_line: Callable[[str], None] | None = None, records: str | None = None) -> Head:
    """The first `limit` lines a command prints (every line for None), as they come: the command is
    stopped (HEAD_STOP: KILL) once they are in, so a caller needing the start of a long output does
    not wait for its end; in every case it is reaped and its pipes closed. With `on_line` every line
    is handed to it as it comes and none is kept (a long output read in bounded memory).

    With `records` (a regex matched at a line's start: where a record begins, as "Frame 12: " begins
    a frame of `tshark -V`), `limit` counts records of many lines: the command is stopped when the
    record after the `limit`-th begins, and `text` holds the first `limit` records (`lines` none: a
    6 MB `tshark -V` page is ~120,000 lines and ~200 records; read as text it is never split)."""
    return await head_of(await open_process(argv), limit, max_line=max_line, on_line=on_line, records=records)


def _hand_on(lines: list[str], on_line: Callable[[str], None], room: int | None) -> int:
    """Hand the lines to `on_line`, at most `room` of them (None: all), and clear them: how many went."""
    taken = lines if room is None else lines[:room]
    for line in taken:
        on_line(line)
    count = len(taken)
    lines.clear()
    return count


async def head_of(proc: trio.Process, limit: int | None, *, max_line: int = 1 << 20,
                  on_line: Callable[[str], None] | None = None, records: str | None = None) -> Head:
    """`head` of a child started already (its stdout and stderr piped, neither read yet): it is
    stopped once `limit` lines (or records) are in, and in every case reaped with its pipes closed."""
    lines: list[str] = []
    texts: list[str] = []  # with `records`: blocks of lines, joined at the end
    stderr = Tail()
    splitter = LineSplitter(max_line=max_line)  # lines taken here: the splitter never calls back
    # A record's start is found after a newline ("\n" + the block: a literal prefix `re` finds by a fast
    # scan), not by a match per line, nor by `^` in MULTILINE mode (5x slower on `tshark -V` text).
    starts = re.compile(f"\n(?:{records})") if records is not None else None
    assert starts is None or on_line is None, "records are kept, not handed on"
    begun = 0  # records begun so far
    handed = 0  # lines handed to on_line so far
    stopped = False
    try:
        async with trio.open_nursery() as nursery:
            stderr_read = trio.Event()

            async def drain_stderr() -> None:
                try:
                    await drain(proc.stderr, stderr.feed)
                finally:
                    stderr_read.set()

            nursery.start_soon(drain_stderr)
            assert proc.stdout is not None
            try:
                while chunk := await proc.stdout.receive_some(1 << 16):
                    if starts is not None:
                        block = splitter.split_text(chunk)
                        if block is None:
                            continue
                        if limit is not None:
                            for start in starts.finditer("\n" + block):
                                begun += 1
                                if begun > limit:  # the block's lines before that record's (none at 0)
                                    block = block[:start.start() - 1] if start.start() else None
                                    stopped = True
                                    break
                        if block is not None:
                            texts.append(block)
                        if stopped:
                            break
                        continue
                    lines += splitter.split(chunk)
                    if on_line is not None:
                        handed += _hand_on(lines, on_line, None if limit is None else limit - handed)
                        if limit is not None and handed >= limit:  # the first `limit` handed on: no more
                            stopped = True
                            break
                    if limit is not None and len(lines) >= limit:
                        stopped = True
                        break
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            if stopped:
                await stop_process(proc, HEAD_STOP)
            elif starts is not None:
                texts += splitter.rest()
            else:
                lines += splitter.rest()
                if on_line is not None:
                    room = None if limit is None else max(0, limit - handed)
                    stopped = room is not None and len(lines) > room  # went on past the limit: said, not handed
                    _hand_on(lines, on_line, room)
            await proc.wait()
            # What it wrote last to stderr (why it failed) may still be in the pipe when it has exited: read to
            # its end, unless a child of its own holds the pipe open.
            with trio.move_on_after(STDERR_AFTER_EXIT_S):
                await stderr_read.wait()
            nursery.cancel_scope.cancel()
    finally:
        await stop_process(proc, HEAD_STOP)  # cancelled or failed: never leave it running
        await close_pipes(proc)
    return Head(lines[:limit] if limit is not None else lines, stopped, proc.returncode, stderr.text(),
                "\n".join(texts))
