"""A simulated AT modem on the master side of a real pseudo-terminal.

pyserial (and diagd) open the slave path exactly like a real port. The modem runs on its own
thread (`with SimModem() as sim:`) or as a process, for tests where diagd is another process:

    python tests/support/sim_modem.py --link /tmp/x [--urc-interval 0.5] [--echo]

prints one JSON line `{"path": "/dev/pts/N", "link": ..., "pid": ...}` once the port exists and
runs until stdin closes or it is signalled. Dying closes the master: the device "disappears" like
an unplugged USB adapter (its link is removed, as udev removes by-id links); starting another one
with the same --link makes it "come back".

Commands (one line, ended by CR or LF; answers framed as a real modem's, "\\r\\nOK\\r\\n"):
    AT, ATI, AT+CSQ, ATE0/ATE1        OK, an identification, a signal report; echo off/on
    AT+CMGS="<number>"               "\\r\\n> " prompt, then text until Ctrl-Z (0x1A) -> +CMGS: <n> OK;
                                     ESC (0x1B) cancels
    anything else                    ERROR
  test extensions:
    AT+SIMURC=<n>,<ms>               OK, then n "+CMTI: "SM",<k>" URCs, one every <ms>
    AT+SIMBIN=<n>                    a binary frame 7E 00 FF <bytes 00..n-1> FF 00 7E (no OK)
    AT+SIMFLOOD=<n>                  n bytes of text lines (flood_bytes), then OK
    AT+SIMDELAY=<ms>                 OK after <ms>
    AT+SIMSILENT                     no answer at all
    AT+SIMSTREAM=<seconds>,<rate>    OK, then stream_bytes(seconds*rate) paced at <rate> bytes/s
A binary frame 7E <payload> 7E sent to the modem is answered with 7E 00 FF <payload> FF 00 7E.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import os
import select
import signal
import sys
import threading
import time
import tty
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

OK = b"\r\nOK\r\n"
ERROR = b"\r\nERROR\r\n"
CTRL_Z, ESC, FLAG = 0x1A, 0x1B, 0x7E


def flood_bytes(n: int) -> bytes:
    line_len = 64
    lines = (f"FLOOD {i:06d} ".encode() + b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmno"[: line_len - 15]
             + b"\r\n" for i in range(n // line_len + 1))
    return b"".join(lines)[:n]


def stream_bytes(n: int) -> bytes:
    """The deterministic content of AT+SIMSTREAM: 64-byte numbered lines, cut at n bytes."""
    body = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRS"[:52]
    return b"".join(b"S%09d " % i + body + b"\r\n" for i in range(n // 64 + 1))[:n]


def binary_frame(payload: bytes) -> bytes:
    return bytes([FLAG, 0x00, 0xFF]) + payload + bytes([0xFF, 0x00, FLAG])


class SimModem:
    def __init__(self, *, link: str | Path | None = None, urc_interval: float | None = None,
                 echo: bool = False) -> None:
        self.master, self._slave = os.openpty()
        tty.setraw(self._slave)
        # The modem keeps its own slave fd open, so the master never reads EIO while no host has
        # the port open (a real modem is there whether or not a host listens).
        os.set_blocking(self.master, False)
        self.path = os.ttyname(self._slave)
        self.link = Path(link) if link else None
        if self.link is not None:
            tmp = self.link.with_name(f".{self.link.name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            os.symlink(self.path, tmp)
            os.replace(tmp, self.link)
        self.echo = echo
        self.received = bytearray()  # every byte the host wrote
        self.sent = bytearray()  # every byte the modem wrote
        self.commands: list[str] = []
        self.messages: list[bytes] = []  # SMS texts sent with AT+CMGS
        self._out = bytearray()
        self._line = bytearray()
        self._sms: bytearray | None = None
        self._frame: bytearray | None = None
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._urc_index = 0
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"sim-modem {self.path}", daemon=True)
        if urc_interval:
            self._every(urc_interval, self._urc)

    # -- public, thread-safe -----------------------------------------------------------------

    def start(self) -> SimModem:
        self._thread.start()
        return self

    def __enter__(self) -> SimModem:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    @property
    def port(self) -> str:
        """The name hosts should open: the link when there is one."""
        return str(self.link) if self.link else self.path

    def emit(self, data: bytes, delay: float = 0.0) -> None:
        """Send `data` to the host after `delay` seconds (a URC, a heartbeat, garbage)."""
        self._at(time.monotonic() + delay, lambda: self._write(data))

    def close(self) -> None:
        """Stop and close the master: to the host, the device disappears."""
        if self._closed:
            return
        self._closed = True
        self._stop = True
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(5)
        for fd in (self.master, self._slave, self._wake_r, self._wake_w):
            os.close(fd)
        if self.link is not None and self.link.is_symlink() and os.readlink(self.link) == self.path:
            self.link.unlink()

    def wait_received(self, needle: bytes, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while needle not in bytes(self.received):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the modem never received {needle!r}")
            time.sleep(0.005)

    # -- the modem thread --------------------------------------------------------------------

    def _at(self, due: float, action: Callable[[], None]) -> None:
        with self._lock:
            heapq.heappush(self._timers, (due, next(self._seq), action))
        os.write(self._wake_w, b"x")

    def _every(self, interval: float, action: Callable[[], None]) -> None:
        def tick() -> None:
            action()
            self._at(time.monotonic() + interval, tick)

        self._at(time.monotonic() + interval, tick)

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop:
            with self._lock:
                next_due = self._timers[0][0] if self._timers else None
            poller.register(self.master, select.POLLIN | (select.POLLOUT if self._out else 0))
            timeout_ms = None if next_due is None else max(0, int((next_due - time.monotonic()) * 1000) + 1)
            for fd, events in poller.poll(timeout_ms):
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                elif events & select.POLLIN:
                    try:
                        data = os.read(self.master, 65536)
                    except (BlockingIOError, OSError):
                        data = b""
                    if data:
                        self.received += data
                        self._input(data)
            while True:
                with self._lock:
                    if not self._timers or self._timers[0][0] > time.monotonic():
                        break
                    _, _, action = heapq.heappop(self._timers)
                action()
            self._flush()

    def _write(self, data: bytes) -> None:
        self._out += data
        self._flush()

    def _flush(self) -> None:
        while self._out:
            try:
                n = os.write(self.master, self._out)
            except (BlockingIOError, OSError):
                return
            self.sent += self._out[:n]
            del self._out[:n]

    def _input(self, data: bytes) -> None:
        for byte in data:
            if self._sms is not None:
                if byte == CTRL_Z:
                    self.messages.append(bytes(self._sms))
                    self._sms = None
                    self._write(b"\r\n+CMGS: %d\r\n" % len(self.messages) + OK)
                elif byte == ESC:
                    self._sms = None
                    self._write(OK)
                else:
                    self._sms.append(byte)
                    if self.echo:
                        self._write(bytes([byte]))
            elif self._frame is not None:
                if byte == FLAG:
                    frame, self._frame = bytes(self._frame), None
                    self._write(binary_frame(frame))
                else:
                    self._frame.append(byte)
            elif byte == FLAG and not self._line:
                self._frame = bytearray()
            elif byte in b"\r\n":
                if self.echo:
                    self._write(bytes([byte]))
                if self._line:
                    line, self._line = self._line.decode(errors="replace").strip(), bytearray()
                    self.commands.append(line)
                    self._command(line)
            else:
                self._line.append(byte)
                if self.echo:
                    self._write(bytes([byte]))

    def _command(self, line: str) -> None:
        cmd = line.upper()
        name, _, arg = cmd.partition("=")
        args = [int(a) for a in arg.split(",") if a.strip().isdigit()]
        if cmd == "AT":
            self._write(OK)
        elif cmd == "ATI":
            self._write(b"\r\nSIMMODEM diagd-test 1.0\r\n" + OK)
        elif cmd == "AT+CSQ":
            self._write(b"\r\n+CSQ: 23,99\r\n" + OK)
        elif cmd in ("ATE0", "ATE1"):
            self.echo = cmd == "ATE1"
            self._write(OK)
        elif name == "AT+CMGS" and arg:
            self._sms = bytearray()
            self._write(b"\r\n> ")
        elif name == "AT+SIMURC" and len(args) == 2:
            self._write(OK)
            for k in range(args[0]):
                self._at(time.monotonic() + args[1] / 1000 * (k + 1), self._urc)
        elif name == "AT+SIMBIN" and len(args) == 1:
            self._write(binary_frame(bytes(i % 256 for i in range(args[0]))))
        elif name == "AT+SIMFLOOD" and len(args) == 1:
            self._write(flood_bytes(args[0]) + OK)
        elif name == "AT+SIMDELAY" and len(args) == 1:
            self._at(time.monotonic() + args[0] / 1000, lambda: self._write(OK))
        elif cmd == "AT+SIMSILENT":
            pass
        elif name == "AT+SIMSTREAM" and len(args) == 2:
            self._write(OK)
            self._stream(args[0] * args[1], args[1])
        else:
            self._write(ERROR)

    def _urc(self) -> None:
        self._urc_index += 1
        self._write(b'\r\n+CMTI: "SM",%d\r\n' % self._urc_index)

    def _stream(self, total: int, rate: int) -> None:
        data = stream_bytes(total)
        start = time.monotonic()
        sent = 0

        def tick() -> None:
            nonlocal sent
            due = min(total, int((time.monotonic() - start) * rate))
            if due > sent:
                self._write(data[sent:due])
                sent = due
            if sent < total:
                self._at(time.monotonic() + 0.005, tick)

        self._at(start, tick)


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--link", help="a symlink to create to the port (replaced atomically)")
    parser.add_argument("--urc-interval", type=float, help="emit a +CMTI URC every this many seconds")
    parser.add_argument("--echo", action="store_true", help="start with echo on (ATE1)")
    args = parser.parse_args()
    sim = SimModem(link=args.link, urc_interval=args.urc_interval, echo=args.echo).start()
    signal.signal(signal.SIGTERM, _exit_on_signal)  # close (and unlink) on the way out
    print(json.dumps({"path": sim.path, "link": args.link, "pid": os.getpid()}), flush=True)
    try:
        while sys.stdin.buffer.read(4096):  # runs until the parent closes our stdin (or dies)
            pass
    except KeyboardInterrupt:
        pass
    finally:
        sim.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
