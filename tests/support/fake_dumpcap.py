"""A scripted dumpcap for unit tests of the capture actor on trio's MockClock (as fake_sharkd.py is for
the pcap pool): what the actor starts is replaced, the actor, its back end and tools are the real ones.

A `Script` says what the capture sees and does, in seconds from dumpcap's start: how long it takes to
open its first file (`start_s`: a slow start), the packets (`batch` every `batch_s`, `packets` in all:
frames of `frame_bytes`, Ethernet/IPv4/UDP), the kernel drops it reports at the end, whether it
ignores SIGINT/SIGTERM (only SIGKILL ends it then) and how long it takes to close on one, and an
early `Exit` with dumpcap's own error text. From its argv (what start_capture built) it takes what
real dumpcap does: `-w`, `-i` (one interface description block each), `-s`, `-f`, `-c`,
`-a duration:/filesize:`, `-b filesize:/files:/duration:` (a ring: `<stem>_<NNNNN>_<YYYYmmddHHMMSS>.pcapng`,
the oldest file deleted when there are more than `files`), and `-d` (the filter's compile check).

It speaks as dumpcap 4.0.17 does in child mode (`-Z none`; every format below was checked against it):
sync-pipe messages on stderr (F the new file, P packets written since the last P after a flush, D
`<drops>:<interface>` per interface once it stops cleanly, E two nested messages, B
`<index>:<message>` for a filter the interface refused), and real pcapng files: SHB, IDBs, EPBs, and
on a clean stop of a single file (not a ring: 4.0 writes none in ring files) one Interface Statistics
Block per interface ("Counters provided by dumpcap", isb_starttime/endtime, isb_ifrecv, isb_ifdrop).
SIGINT (and SIGTERM, SIGHUP) stop it cleanly: P, the statistics, D, status 0; SIGKILL ends it at once
(status -9, no statistics, no D).

Two ways to run one script:
- in process (`FakeDumpcaps(script, nursery).spawn`, the capture back end's `spawn`): a stand-in for
  `trio.Process` played on the Trio clock, so timers are exact under MockClock. Its pid is above
  the kernel's PID_MAX_LIMIT, so the actor's `os.killpg` finds no such group and falls back to
  `send_signal` (which the fake serves) and can never signal a real process.
- as a real program (`python fake_dumpcap.py <dumpcap args>`, the script as JSON in $FAKE_DUMPCAP_SCRIPT):
  the same play with real signals, pipes and exit, for the tests of reaping and escalation by the kernel.
It imports only the standard library and trio.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import signal
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import trio

SCRIPT_ENV = "FAKE_DUMPCAP_SCRIPT"
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: what the fake's clock reads at its start (timestamps, names)
PID_MAX_LIMIT = 4 * 1024 * 1024  # include/linux/threads.h (64-bit): no pid, hence no process group, reaches it
_pids = itertools.count(PID_MAX_LIMIT + 1000)


@dataclass(frozen=True)
class Exit:
    """dumpcap ends by itself `at_s` after its start with `status` (negative: killed by that signal, with
    nothing said), saying why as dumpcap does: an E message (`error`, `secondary`), a B message (the
    interface refused the filter: `bad_filter` is libpcap's text), or plain text on stderr."""

    at_s: float = 0.0
    status: int = 1
    error: str | None = None
    secondary: str = ""
    bad_filter: str | None = None
    text: str = ""


@dataclass(frozen=True)
class Script:
    interfaces: tuple[str, ...] = ("veth0",)  # what exists: another one is "no device named ..."
    start_s: float = 0.0  # until the first file is open (and F sent)
    batch_s: float = 1.0  # every batch_s after the first file opened, `batch` packets arrive
    batch: int = 10
    packets: int | None = None  # in all (None: as long as it runs)
    frame_bytes: int = 100
    drops: dict[str, int] = field(default_factory=dict)  # interface -> kernel drops (D, isb_ifdrop)
    ignore: tuple[str, ...] = ()  # signals it ignores ("SIGINT", "SIGTERM", "SIGHUP"); SIGKILL always works
    close_s: float = 0.0  # a clean stop takes this long (SIGKILL meanwhile still ends it at once)
    exit: Exit | None = None
    invalid_filters: dict[str, str] = field(default_factory=dict)  # filter -> libpcap's message (`-d`)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Script:
        data: dict[str, Any] = json.loads(text)
        data["interfaces"] = tuple(data.get("interfaces", ("veth0",)))
        data["ignore"] = tuple(data.get("ignore", ()))
        if data.get("exit") is not None:
            data["exit"] = Exit(**data["exit"])
        return cls(**data)


# -- what dumpcap writes ---------------------------------------------------------------------------------

def message(kind: str, payload: bytes) -> bytes:
    """One sync-pipe message (sync_pipe.h): indicator, 3-byte big-endian length, payload."""
    return kind.encode() + len(payload).to_bytes(3, "big") + payload


def text_message(kind: str, text: str) -> bytes:
    return message(kind, text.encode() + b"\0")


def error_message(primary: str, secondary: str = "") -> bytes:
    """E: two nested messages, the primary text and the secondary one (often empty)."""
    return message("E", text_message("E", primary) + text_message("E", secondary))


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _block(block_type: int, body: bytes) -> bytes:
    length = 12 + len(body)
    return struct.pack("<II", block_type, length) + body + struct.pack("<I", length)


def section_header() -> bytes:
    options = _option(4, b"Dumpcap (Wireshark) 4.0.17 (fake_dumpcap.py)") + _option(0, b"")
    return _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1) + options)


def interface_description(name: str, snaplen: int, capture_filter: str) -> bytes:
    options = _option(2, name.encode())
    if capture_filter:
        options += _option(11, b"\0" + capture_filter.encode())  # if_filter: a libpcap filter string
    options += _option(9, b"\x06") + _option(0, b"")  # if_tsresol: microseconds
    return _block(1, struct.pack("<HHI", 1, 0, snaplen) + options)


def _timestamp(seconds: float) -> tuple[int, int]:
    micros = round(seconds * 1e6)
    return micros >> 32, micros & 0xFFFFFFFF


def enhanced_packet(interface: int, seconds: float, frame: bytes, snaplen: int) -> bytes:
    captured = frame[:snaplen]
    high, low = _timestamp(seconds)
    body = struct.pack("<IIIII", interface, high, low, len(captured), len(frame))
    return _block(6, body + captured + b"\0" * (-len(captured) % 4))


def interface_statistics(interface: int, start: float, end: float, received: int, dropped: int) -> bytes:
    high, low = _timestamp(end)
    options = (_option(1, b"Counters provided by dumpcap")
               + _option(2, struct.pack("<II", *_timestamp(start))) + _option(3, struct.pack("<II", high, low))
               + _option(4, struct.pack("<Q", received)) + _option(5, struct.pack("<Q", dropped)) + _option(0, b""))
    return _block(5, struct.pack("<III", interface, high, low) + options)


def frame(number: int, size: int) -> bytes:
    """An Ethernet/IPv4/UDP frame of `size` bytes (at least 42) from 10.0.0.1:40000 to 10.0.0.2:9999,
    its payload the packet's number (the IPv4 header checksum is right; UDP's is 0: none)."""
    payload = number.to_bytes(8, "big").ljust(max(0, size - 42), b"\xa5")
    udp = struct.pack("!HHHH", 40000, 9999, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), number & 0xFFFF, 0x4000, 64, 17, 0,
                     bytes((10, 0, 0, 1)), bytes((10, 0, 0, 2)))
    words = sum(struct.unpack("!10H", ip))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    ip = ip[:10] + struct.pack("!H", ~words & 0xFFFF) + ip[12:]
    return bytes.fromhex("020000000002" "020000000001" "0800") + ip + udp


# -- dumpcap's arguments ---------------------------------------------------------------------------------

@dataclass
class Args:
    mode: str = "capture"  # "compile" (-d), "list" (-D), "link_types" (-L)
    write: str = ""
    interfaces: list[str] = field(default_factory=list)
    filters: dict[str, str] = field(default_factory=dict)  # per interface (-f follows its -i)
    snaplen: int = 262144
    count: int | None = None  # -c
    duration_s: float | None = None  # -a duration:
    autostop_kb: int | None = None  # -a filesize:
    ring_files: int | None = None  # -b files:
    ring_kb: int | None = None  # -b filesize:
    ring_s: float | None = None  # -b duration:

    @property
    def ring(self) -> bool:
        return self.ring_kb is not None or self.ring_s is not None

    @classmethod
    def parse(cls, argv: Sequence[str]) -> Args:
        args, tokens = cls(), iter(argv)
        valued = {"-Z", "-w", "-i", "-s", "-B", "-f", "-a", "-b", "-c", "-y"}
        for token in tokens:
            value = next(tokens, "") if token in valued else ""
            match token:
                case "-d":
                    args.mode = "compile"
                case "-D":
                    args.mode = "list"
                case "-L":
                    args.mode = "link_types"
                case "-w":
                    args.write = value
                case "-i":
                    args.interfaces.append(value)
                case "-s":
                    args.snaplen = int(value)
                case "-f":
                    args.filters[args.interfaces[-1] if args.interfaces else ""] = value
                case "-c":
                    args.count = int(value)
                case "-a" | "-b":
                    key, _, number = value.partition(":")
                    attribute = {("-a", "duration"): "duration_s", ("-a", "filesize"): "autostop_kb",
                                 ("-b", "files"): "ring_files", ("-b", "filesize"): "ring_kb",
                                 ("-b", "duration"): "ring_s"}.get((token, key))
                    if attribute is None:
                        raise ValueError(f"fake dumpcap: {token} {value} is not scripted")
                    setattr(args, attribute, float(number) if attribute.endswith("_s") else int(number))
        return args


def dumpcap_args(argv: Sequence[str]) -> list[str]:
    """dumpcap's own arguments in a command line: after the sandbox launcher's last `--` and the
    executable (settings.command as root), else after argv[0] (unconfined)."""
    argv = list(argv)
    if "--" in argv:
        return argv[len(argv) - argv[::-1].index("--") + 1:]
    return argv[1:]


# -- one run ---------------------------------------------------------------------------------------------

class Outlet(Protocol):
    """Where a run's output goes: its stdout and stderr."""

    def stdout(self, data: bytes) -> None: ...

    def stderr(self, data: bytes) -> None: ...


class Run:
    """One dumpcap run playing a script: `play()` returns its exit status. What it did is kept:
    `signals` (Trio time, name) as they came, `created` (every file it opened, in order), `written`."""

    def __init__(self, script: Script, argv: Sequence[str], outlet: Outlet,
                 signals: trio.MemoryReceiveChannel[str]) -> None:
        self.script = script
        self.args = Args.parse(argv)
        self.outlet = outlet
        self._signals = signals
        self.signals: list[tuple[float, str]] = []
        self.created: list[str] = []
        self.written = 0  # packets written in all
        self.received: dict[str, int] = {}  # per interface
        self._unreported = 0  # written since the last P
        self._file: str | None = None
        self._file_opened_at = 0.0
        self._opened_at: float | None = None  # the first file's
        self._t0 = 0.0

    def clock(self) -> float:
        """The fake's wall clock: EPOCH at its start."""
        return EPOCH + trio.current_time() - self._t0

    async def play(self) -> int:
        self._t0 = trio.current_time()
        if self.args.mode == "compile":
            return self._compile()
        if self.args.mode in ("list", "link_types"):
            self.outlet.stdout("".join(f"{n}. {name}\n" for n, name in enumerate(self.script.interfaces, 1)).encode()
                               if self.args.mode == "list" else b"Data link types of interface (use option -y):\n"
                               b"  EN10MB (Ethernet)\n")
            return 0
        for interface in self.args.interfaces:
            if interface not in self.script.interfaces:
                self.outlet.stderr(error_message(f'There is no device named "{interface}".\n(No such device exists)'))
                return 1
        script, args = self.script, self.args
        batches = 0
        while True:
            now = trio.current_time()
            due = [self._t0 + script.exit.at_s if script.exit else math.inf]
            if self._opened_at is None:
                due.append(self._t0 + script.start_s)
            else:
                if script.packets is None or self.written < script.packets:
                    due.append(self._opened_at + (batches + 1) * script.batch_s)
                if args.duration_s is not None:
                    due.append(self._opened_at + args.duration_s)
                if args.ring_s is not None:
                    due.append(self._file_opened_at + args.ring_s)
            at = min(due)
            name: str | None = None
            if at > now:
                with trio.move_on_at(at):
                    name = await self._signals.receive()
            if name is not None:
                self.signals.append((trio.current_time(), name))
                if name in script.ignore:
                    continue
                return await self._stop()
            now = trio.current_time()
            if script.exit is not None and now >= self._t0 + script.exit.at_s:
                return self._fail(script.exit)
            if self._opened_at is None:
                self._open()
                self._opened_at = now
                continue
            if args.ring_s is not None and now >= self._file_opened_at + args.ring_s:
                self._switch()
            if (script.packets is None or self.written < script.packets) and \
                    now >= self._opened_at + (batches + 1) * script.batch_s:
                batches += 1
                if self._batch():  # -c or -a filesize reached
                    return await self._stop()
            if args.duration_s is not None and now >= self._opened_at + args.duration_s:
                return await self._stop()

    def _compile(self) -> int:
        """`dumpcap -d`: the BPF program on stdout; errors on stderr with status 0, as 4.0.17 does."""
        name = self.args.interfaces[0] if self.args.interfaces else ""
        self.outlet.stderr(f"Capturing on '{name}'\n".encode())
        if name not in self.script.interfaces:
            self.outlet.stderr(f'dumpcap: There is no device named "{name}".\n(No such device exists)\n'.encode())
            return 0
        capture_filter = self.args.filters.get(name, "")
        if capture_filter in self.script.invalid_filters:
            self.outlet.stderr(f"dumpcap: Invalid capture filter \"{capture_filter}\" for interface '{name}'.\n\n"
                               f"That string isn't a valid capture filter "
                               f"({self.script.invalid_filters[capture_filter]}).\n"
                               "See the User's Guide for a description of the capture filter syntax.\n".encode())
            return 0
        self.outlet.stdout(f"(000) ret      #{self.args.snaplen}\n".encode())
        return 0

    # -- files

    def _path(self) -> str:
        if not self.args.ring:
            return self.args.write
        stem, dot, suffix = self.args.write.rpartition(".")
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(self.clock()))
        return f"{stem}_{len(self.created) + 1:05d}_{stamp}{dot}{suffix}" if dot else \
            f"{suffix}_{len(self.created) + 1:05d}_{stamp}"

    def _open(self) -> None:
        path = self._path()
        if self.args.ring_files is not None and len(self.created) >= self.args.ring_files:
            os.unlink(self.created[len(self.created) - self.args.ring_files])  # the oldest the ring keeps
        head = section_header() + b"".join(
            interface_description(name, self.args.snaplen, self.args.filters.get(name, ""))
            for name in self.args.interfaces)
        Path(path).write_bytes(head)
        self.created.append(path)
        self._file, self._file_opened_at = path, trio.current_time()
        self.outlet.stderr(text_message("F", path))

    def _append(self, data: bytes) -> int:
        assert self._file is not None
        with open(self._file, "ab") as f:
            f.write(data)
            return f.tell()

    def _report(self) -> None:
        """P: the packets written since the last one (the file is flushed: whole up to here)."""
        if self._unreported:
            self.outlet.stderr(text_message("P", str(self._unreported)))
            self._unreported = 0

    def _switch(self) -> None:
        self._report()
        self._open()

    def _batch(self) -> bool:
        """One batch of packets; True when a stop condition of dumpcap's own (-c, -a filesize) is reached."""
        script, args = self.script, self.args
        want = script.batch if script.packets is None else min(script.batch, script.packets - self.written)
        for _ in range(want):
            interface = self.written % len(args.interfaces)
            name = args.interfaces[interface]
            size = self._append(enhanced_packet(interface, self.clock(), frame(self.written + 1, script.frame_bytes),
                                                args.snaplen))
            self.written += 1
            self._unreported += 1
            self.received[name] = self.received.get(name, 0) + 1
            if args.count is not None and self.written >= args.count:
                return True
            if args.autostop_kb is not None and size >= args.autostop_kb * 1000:
                return True
            if args.ring_kb is not None and size >= args.ring_kb * 1000:
                self._switch()
        self._report()
        return False

    # -- endings

    async def _stop(self) -> int:
        """A clean stop: the last packets reported, the statistics blocks (a single file), the drops."""
        await trio.sleep(self.script.close_s)
        if self._file is None:
            return 0
        self._report()
        if not self.args.ring:
            end = self.clock()
            start = EPOCH + (self._opened_at or self._t0) - self._t0
            self._append(b"".join(
                interface_statistics(i, start, end, self.received.get(name, 0) + self.script.drops.get(name, 0),
                                     self.script.drops.get(name, 0))
                for i, name in enumerate(self.args.interfaces)))
        for name in self.args.interfaces:
            self.outlet.stderr(text_message("D", f"{self.script.drops.get(name, 0)}:{name}"))
        return 0

    def _fail(self, how: Exit) -> int:
        if self._file is not None:
            self._report()
        if how.text:
            self.outlet.stderr(how.text.encode())
        if how.bad_filter is not None:
            self.outlet.stderr(text_message("B", f"0:{how.bad_filter}"))
        if how.error is not None:
            self.outlet.stderr(error_message(how.error, how.secondary))
        return how.status


# -- in process: a trio.Process stand-in -----------------------------------------------------------------

class Pipe(trio.abc.ReceiveStream):
    """The read end of a child's pipe: what the fake writes, then EOF when it exits."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[bytes](math.inf)
        self._pending = b""
        self._closed = False

    def write(self, data: bytes) -> None:
        try:
            self._send.send_nowait(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # our end was closed: as EPIPE, the child goes on

    def close_write(self) -> None:
        self._send.close()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError
        if self._pending:
            await trio.lowlevel.checkpoint()
        else:
            try:
                self._pending = await self._receive.receive()
            except trio.EndOfChannel:
                return b""
        cut = len(self._pending) if max_bytes is None else max_bytes
        chunk, self._pending = self._pending[:cut], self._pending[cut:]
        return chunk

    async def aclose(self) -> None:
        self._closed = True
        self._receive.close()
        await trio.lowlevel.checkpoint()


class FakeDumpcap:
    """One launched dumpcap, as the actor sees a trio.Process: pid, pipes, signals, wait, returncode.
    `reaped`: its exit was collected by `wait()` (what reaps a real child)."""

    def __init__(self, script: Script, argv: Sequence[str], nursery: trio.Nursery) -> None:
        self.argv = list(argv)
        self.args = self.argv  # trio.Process's name for it
        self.pid = next(_pids)
        self.stdin = None
        self.stdout = Pipe()
        self.stderr = Pipe()
        self.returncode: int | None = None
        self.reaped = False
        self.started_at = trio.current_time()
        self.exited_at: float | None = None
        self._send_signal, receive = trio.open_memory_channel[str](math.inf)
        self.run = Run(script, dumpcap_args(argv), _Outlet(self), receive)
        self._scope = trio.CancelScope()
        self._exited = trio.Event()
        self.killed_at: float | None = None
        nursery.start_soon(self._live)

    def __repr__(self) -> str:
        state = "running" if self.returncode is None else f"exited {self.returncode}"
        return f"<FakeDumpcap {self.pid} [{state}, signals: {self.signals}]>"

    @property
    def signals(self) -> list[tuple[float, str]]:
        """(Trio time, name) of every signal it got, SIGKILL included."""
        killed = [] if self.killed_at is None else [(self.killed_at, "SIGKILL")]
        return sorted(self.run.signals + killed)

    async def _live(self) -> None:
        status = -signal.SIGKILL
        with self._scope:
            status = await self.run.play()
        self.stdout.close_write()
        self.stderr.close_write()
        self.returncode, self.exited_at = status, trio.current_time()
        self._exited.set()

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return  # as Popen.send_signal: an exited child is not signalled
        if sig == signal.SIGKILL:
            if self.killed_at is None:
                self.killed_at = trio.current_time()
            self._scope.cancel()
        else:
            self._send_signal.send_nowait(signal.Signals(sig).name)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        return self.returncode

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        self.reaped = True
        return self.returncode


class _Outlet:
    def __init__(self, proc: FakeDumpcap) -> None:
        self._proc = proc

    def stdout(self, data: bytes) -> None:
        self._proc.stdout.write(data)

    def stderr(self, data: bytes) -> None:
        self._proc.stderr.write(data)


class FakeDumpcaps:
    """The capture back end's `spawn` (`CaptureBackend(runtime, spawn=fakes.spawn)`): every command
    (the filter check and the captures) starts a FakeDumpcap playing `script` in `nursery`, which must
    outlive the runtime (a daemon's shutdown still signals its captures). `script` may be replaced
    between starts."""

    def __init__(self, script: Script, nursery: trio.Nursery) -> None:
        self.script = script
        self.nursery = nursery
        self.launched: list[FakeDumpcap] = []

    async def spawn(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> trio.Process:
        await trio.lowlevel.checkpoint()
        proc = FakeDumpcap(self.script, argv, self.nursery)
        self.launched.append(proc)
        return cast(trio.Process, proc)

    @property
    def captures(self) -> list[FakeDumpcap]:
        """The capturing runs (not the `-d` checks), in launch order."""
        return [p for p in self.launched if p.run.args.mode == "capture"]

    def unreaped(self) -> list[FakeDumpcap]:
        return [p for p in self.launched if p.returncode is None or not p.reaped]


# -- as a real program -----------------------------------------------------------------------------------

def command(script: Script, argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run `argv`'s dumpcap arguments as this program, playing `script`."""
    return [sys.executable, __file__, *dumpcap_args(argv)], {**os.environ, SCRIPT_ENV: script.to_json()}


class _Fds:
    def stdout(self, data: bytes) -> None:
        os.write(1, data)

    def stderr(self, data: bytes) -> None:
        os.write(2, data)


async def _main(script: Script, argv: list[str]) -> int:
    send, receive = trio.open_memory_channel[str](math.inf)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as received:
        async with trio.open_nursery() as nursery:
            async def forward() -> None:
                async for number in received:
                    send.send_nowait(signal.Signals(number).name)

            nursery.start_soon(forward)
            status = await Run(script, argv, _Fds(), receive).play()
            nursery.cancel_scope.cancel()
    return status


def main() -> None:
    status = trio.run(_main, Script.from_json(os.environ.get(SCRIPT_ENV, "{}")), sys.argv[1:])
    if status < 0:  # killed by a signal, as scripted
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
