"""Driving `crash` through a pseudo-terminal with pexpect. Blocking: call only from worker threads.

How a command's output is delimited (measured with crash 8.0.2 on the fixture):
- The pty is spawned with echo off, so crash prints only output and prompts.
- `crash> ` alone is not a safe delimiter: `help set` prints example sessions containing it, and
  crash rewrites them with its program name, so a renamed prompt does not help either. Each
  command is therefore followed by `ascii <random 64-bit hex>` (0.3 ms), whose output starts with
  that number: the command's output is everything before `crash> <nonce>: `, and the exchange is
  over when the prompt follows the marker line.
- A command that runs too long (or whose output passes the size cap) gets Ctrl-C; crash abandons
  it and prompts again, the tty flushes the queued marker, and a fresh marker resynchronises the
  stream. Partial output is kept. Only if that fails is the session lost.
- Output is never gathered in memory: it goes to a sink as it arrives (the command's output file,
  see `output.OutputWriter`; a small in-memory sink for diagd's own queries), minus the last
  few bytes that may be the start of the marker. Past the sink's limit the command gets Ctrl-C and
  its output stays cut there.

Exactly one thread talks to the pty at a time (`lock`); a call abandoned by its Trio caller keeps
the lock until its own interrupt-and-resync is done, so the next command starts on a clean prompt.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import outcome
import pexpect
import trio

from diagd.actors._subprocess import default_signals, describe_exit

PROMPT = b"crash> "
READ_SLICE_S = 0.05
RESYNC_RESEND_S = 1.0
STARTUP_KEEP_BYTES = 1 << 20


class CrashExited(Exception):
    """crash's pty reached EOF: the process is gone (see `describe_status`)."""


class CrashUnresponsive(Exception):
    """crash did not come back to its prompt after Ctrl-C."""


@dataclass(frozen=True)
class RunOutput:
    duration_s: float
    interrupted: bool = False
    truncated: bool = False  # the sink's limit cut the output
    reason: str | None = None  # why it was interrupted


class OutputSink(Protocol):
    """Where a command's output goes as it is produced; it sets `truncated` once `limit` is passed."""

    limit: int
    truncated: bool

    def write(self, data: bytes | bytearray) -> None: ...

    def close(self) -> None: ...


class MemorySink:
    """A small output kept in memory (diagd's own queries such as `set`), cut at `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.truncated = False
        self.data = bytearray()

    def write(self, data: bytes | bytearray) -> None:
        room = self.limit - len(self.data)
        if len(data) > room:
            self.truncated = True
        self.data += data[:max(0, room)]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")

    def close(self) -> None:
        pass


def clean(raw: bytes | bytearray) -> str:
    return _strip_cr(raw).decode("utf-8", errors="replace")


def _strip_cr(raw: bytes | bytearray) -> bytes:
    # The tty turns "\n" into "\r\n"; dropping every CR also works across chunk boundaries.
    return bytes(raw).replace(b"\r", b"")


class CrashDriver:
    def __init__(self, child: pexpect.spawn) -> None:
        self.child = child
        self.pid: int = child.pid
        self.lock = threading.Lock()
        self.commands = 0

    @classmethod
    def spawn(cls, argv: Sequence[str], *, cwd: str, env: dict[str, str]) -> CrashDriver:
        """Fork crash on a new pty (its own session: a process-group leader, like open_process)."""
        child = pexpect.spawn(argv[0], list(argv[1:]), cwd=cwd, env=env, echo=False, encoding=None, timeout=None,
                              maxread=65536, dimensions=(50, 400), preexec_fn=default_signals)
        child.delaybeforesend = None  # pexpect sleeps 50 ms before every send by default
        return cls(child)

    # -- reading ------------------------------------------------------------------------------------

    def _read(self, timeout: float) -> bytes:
        try:
            data: bytes = self.child.read_nonblocking(65536, timeout=timeout)
            return data
        except pexpect.TIMEOUT:
            return b""
        except (pexpect.EOF, OSError):
            raise CrashExited("crash's terminal closed") from None

    def wait_ready(self, timeout_s: float, abort: threading.Event) -> str:
        """Wait for the first prompt; returns what crash printed while loading (its warnings)."""
        with self.lock:
            deadline = time.monotonic() + timeout_s
            buf = bytearray()
            while not buf.endswith(PROMPT):
                if len(buf) > STARTUP_KEEP_BYTES * 2:
                    del buf[:-STARTUP_KEEP_BYTES]  # loading chatter: its end says what went wrong
                if abort.is_set():
                    raise CrashUnresponsive("abandoned while crash was loading")
                if time.monotonic() > deadline:
                    raise CrashUnresponsive(f"crash did not reach its prompt within {timeout_s:g} s")
                try:
                    buf += self._read(READ_SLICE_S)
                except CrashExited:
                    raise CrashExited(clean(buf)) from None
            return clean(buf[: -len(PROMPT)])

    # -- commands -----------------------------------------------------------------------------------

    def run(self, command: str, *, timeout_s: float, abort: threading.Event, sink: OutputSink,
            interrupt_grace_s: float = 10.0) -> RunOutput:
        with self.lock:
            return self._run(command, timeout_s, abort, sink, interrupt_grace_s)

    def _run(self, command: str, timeout_s: float, abort: threading.Event, sink: OutputSink,
             grace_s: float) -> RunOutput:
        started = time.monotonic()
        deadline = started + timeout_s
        nonce = _nonce()
        marker = PROMPT + nonce + b": "
        self.commands += 1
        self.child.send(command.encode() + b"\nascii " + nonce + b"\n")
        pending = bytearray()  # read but not yet in the sink: may hold the start of the marker
        found = False
        while True:
            reason = None
            if abort.is_set():
                reason = "abandoned by the caller"
            elif time.monotonic() > deadline:
                reason = f"timed out after {timeout_s:g} s"
            elif sink.truncated:
                reason = f"output passed {sink.limit} bytes"
            if reason is not None:
                if not found:
                    sink.write(_strip_cr(pending))
                self.interrupt(grace_s)
                return RunOutput(time.monotonic() - started, interrupted=True, truncated=sink.truncated,
                                 reason=reason)
            chunk = self._read(READ_SLICE_S)
            if not chunk:
                continue
            pending += chunk
            if not found:
                at = pending.find(marker)
                if at >= 0:
                    sink.write(_strip_cr(pending[:at]))
                    del pending[:at]
                    found = True
                elif len(pending) >= len(marker):
                    sink.write(_strip_cr(pending[:1 - len(marker)]))
                    del pending[:1 - len(marker)]
            if found and pending.endswith(PROMPT) and pending.find(b"\n") > 0:
                # An output that passed the cap within the read that also brought the prompt is cut
                # all the same: say so, or the caller takes a cut output for the whole one.
                return RunOutput(time.monotonic() - started, truncated=sink.truncated,
                                 reason=f"output passed {sink.limit} bytes" if sink.truncated else None)

    def interrupt(self, grace_s: float) -> None:
        """Ctrl-C, then wait for a fresh marker: the next command starts on a clean prompt."""
        self.child.sendintr()
        self._resync(grace_s)

    def _resync(self, grace_s: float) -> None:
        # A marker sent while crash is still taking the Ctrl-C can be discarded with the rest of
        # the typeahead, so a fresh one goes out every RESYNC_RESEND_S until one comes back. Only
        # the newest counts: crash reads its input in order, so once that one is answered every
        # earlier line has been answered or thrown away, and the next command starts clean.
        deadline = time.monotonic() + grace_s
        buf = bytearray()
        marker = b""
        resend_at = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() >= resend_at:
                nonce = _nonce()
                marker = PROMPT + nonce + b": "
                self.child.send(b"ascii " + nonce + b"\n")
                resend_at = time.monotonic() + RESYNC_RESEND_S
            buf += self._read(READ_SLICE_S)
            at = buf.find(marker)
            if at >= 0 and buf.endswith(PROMPT) and buf.find(b"\n", at) > 0:
                return
            if len(buf) > 1 << 20:
                del buf[: -(1 << 16)]
        raise CrashUnresponsive(f"crash did not return to its prompt within {grace_s:g} s of Ctrl-C")

    # -- the end ------------------------------------------------------------------------------------

    def request_quit(self) -> None:
        """Graceful stop: `quit`, after Ctrl-C if a command is running.

        crash discards typeahead when it takes Ctrl-C, so `quit` must come after it has settled.
        """
        try:
            if self.lock.acquire(blocking=False):
                try:
                    self.child.send(b"quit\n")
                finally:
                    self.lock.release()
                return
            self.child.sendintr()
            time.sleep(0.3)
            self.child.send(b"quit\n")
        except OSError:
            pass

    def close(self, lock_timeout_s: float = 5.0) -> None:
        """Reap the process and close the pty, once no thread is reading it.

        Closing the fd under a reading thread could hand the number to another file that thread
        would then read: if the lock cannot be had, the fd is left open instead.
        """
        if self.lock.acquire(timeout=lock_timeout_s):
            try:
                self.child.close(force=True)
            finally:
                self.lock.release()


async def spawn_in_owner_thread(argv: Sequence[str], *, cwd: str, env: dict[str, str], name: str
                                ) -> tuple[CrashDriver, threading.Event]:
    """Fork crash from a thread that lives as long as the session; set the returned event to end it.

    Measured: crash exits (status 1) when the thread that forked it exits after crash started up
    (it ties itself to its parent thread), and Trio's cached worker threads exit after 10 s idle.
    So the fork happens on a dedicated thread, which then just waits for the session to end.
    """
    release = threading.Event()
    token = trio.lowlevel.current_trio_token()
    spawned = trio.Event()
    box: list[outcome.Outcome[CrashDriver]] = []

    def deliver(result: outcome.Outcome[CrashDriver]) -> None:
        box.append(result)
        spawned.set()

    def owner() -> None:
        result = outcome.capture(lambda: CrashDriver.spawn(argv, cwd=cwd, env=env))
        token.run_sync_soon(deliver, result)
        if isinstance(result, outcome.Value):
            release.wait()

    threading.Thread(target=owner, name=name, daemon=True).start()
    await spawned.wait()
    return box[0].unwrap(), release


def _nonce() -> bytes:
    # 16 hex digits with the top bit set: `ascii` prints it back exactly (no leading zeros to drop).
    return f"{secrets.randbits(64) | 1 << 63:x}".encode()


# ---------------------------------------------------------------------------------------------
# Process status without reaping (pexpect reaps; we only watch)


class PtyChild:
    """The part of `trio.Process` that `_subprocess.stop_process` uses, for a pexpect child.

    Exit is observed through a pidfd (no polling) and read with WNOWAIT, so pexpect still reaps
    the process itself and records its own status.
    """

    def __init__(self, driver: CrashDriver) -> None:
        self.driver = driver
        self.pid = driver.pid
        self._pidfd: int | None = os.pidfd_open(self.pid)
        self._status: int | None = None
        self._pidfd_waiter = False

    @property
    def returncode(self) -> int | None:
        if self._status is not None:
            return self._status
        try:
            result = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # already reaped by pexpect: take its record
            child = self.driver.child
            sig = child.signalstatus
            self._status = -int(sig) if sig else int(child.exitstatus or 0)
            return self._status
        if result is None:
            return None
        if result.si_code == os.CLD_EXITED:
            self._status = result.si_status
        else:
            self._status = -result.si_status
        return self._status

    async def wait(self) -> int:
        """Wait for exit. One task at a time can wait on the pidfd (epoll); others poll briefly."""
        code = self.returncode
        while code is None:
            if self._pidfd is not None and not self._pidfd_waiter:
                self._pidfd_waiter = True
                try:
                    await trio.lowlevel.wait_readable(self._pidfd)
                finally:
                    self._pidfd_waiter = False
            else:
                await trio.sleep(0.05)
            code = self.returncode
        return code

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def close(self) -> None:
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


def describe_status(code: int | None) -> str:
    return describe_exit(code)
