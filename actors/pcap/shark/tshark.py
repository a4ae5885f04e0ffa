"""One-shot tshark passes, for the first request on a capture while its sharkd worker loads.

sharkd's `load` is itself a full pass over the file, so the first question on a fresh capture
would cost two passes. Running the one tshark pass that answers it, side by side with the load on
the other core, answers in about the time of a plain `tshark -r FILE -Y FILTER`; later calls go to
the warm worker. Output is parsed from tshark's text, so only stable formats are used.
"""

from __future__ import annotations

import os
import re
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import trio

from diagd.actors._subprocess import RunHead, head, run
from diagd.actors.pcap.shark import halves, recordwalk
from diagd.actors.pcap.shark.wireshark import COLUMN_PREFIX, column_format_pref
from diagd.protocol.errors import DiagdError, ErrorCode

_UNITS = {"bytes": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
_CONV = re.compile(
    r"^(\S+)\s+<->\s+(\S+)\s+(\d+)\s+([\d.]+)\s+(bytes|kB|MB|GB)\s+(\d+)\s+([\d.]+)\s+(bytes|kB|MB|GB)"
    r"\s+(\d+)\s+([\d.]+)\s+(bytes|kB|MB|GB)\s+")


def base_argv(path: Path, decode_as: Sequence[str], preferences: Sequence[tuple[str, str]]) -> list[str]:
    # -2: two passes, as sharkd dissects a loaded capture (every frame seen before any is shown), so
    # links to later frames (pfcp.response_in, diameter.answer_in) exist and a filter such as
    # `!pfcp.response_in` means the same here as in the warm worker. -n: no name resolution, which
    # the workers switch off too.
    argv = ["tshark", "-r", str(path), "-n", "-2"]
    for rule in decode_as:
        argv += ["-d", rule]
    for name, value in preferences:
        argv += ["-o", f"{name}:{value}"]
    return argv


TRUNCATED = "cut short in the middle of a packet"
EMPTY_PCAP = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)  # a pcap header, no packets


async def filter_refusal(display_filter: str) -> str | None:
    """What tshark's display-filter compiler says of `display_filter`, or None when it compiles.

    tshark compiles -Y before it opens the file, so on an empty capture any failure is the filter's:
    a failed -Y run is INVALID_FILTER by what tshark does, not by words in its message.
    """
    fd, name = tempfile.mkstemp(prefix="diagd-empty-", suffix=".pcap")
    try:
        os.write(fd, EMPTY_PCAP)
        os.close(fd)
        done = await run(["tshark", "-n", "-r", name, "-Y", display_filter], timeout_s=60.0)
    finally:
        os.unlink(name)
    if done.returncode == 0:
        return None
    said = [line for line in done.stderr.splitlines() if line and not line.startswith("Running as user")]
    return "\n".join(said)[-2000:] or f"tshark exited with status {done.returncode}"


async def _run(argv: list[str], warnings: list[str] | None = None) -> str:
    # TZ=UTC: capinfos prints local times.
    done = await run(argv, env={**os.environ, "TZ": "UTC"})
    err = done.stderr
    if done.returncode != 0 and not (TRUNCATED in err and done.stdout):  # a cut-short file still has data
        messages = [line for line in err.splitlines() if line and not line.startswith("Running as user")]
        message = "\n".join(messages)[-2000:]
        refused = await filter_refusal(argv[argv.index("-Y") + 1]) if "-Y" in argv else None
        if refused is not None:
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {refused}",
                             display_filter=argv[argv.index("-Y") + 1])
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"cannot read the capture: {message}",
                         exit_code=done.returncode)
    if warnings is not None and TRUNCATED in err:
        warnings.append(f"The file appears to have been {TRUNCATED}: frames up to the cut are shown")
    return done.out


async def frames(base: list[str], display_filter: str) -> list[dict[str, Any]]:
    """The packet list of a filter. `-T tabs` (the summary line, tab-separated) costs what a plain
    `-Y` pass costs; `-T fields -e _ws.col.*` would build columns for every frame (3x slower)."""
    argv = [*base, *(["-Y", display_filter] if display_filter else []), "-T", "tabs"]
    return [row for line in (await _run(argv)).splitlines() if (row := tabs_row(line)) is not None]


def tabs_row(line: str) -> dict[str, Any] | None:
    """One packet-list row of `tshark -T tabs` (None for a line that is none)."""
    c = [cell.strip() for cell in line.split("\t")]
    if len(c) < 8 or not c[0].isdigit():  # No., Time, Source, arrow, Destination, Protocol, Length, Info
        return None
    return {"number": int(c[0]), "time_relative": float(c[1] or 0), "src": c[2], "dst": c[4],
            "protocol": c[5], "length": int(c[6] or 0), "info": " ".join(c[7:]).strip()}


async def info(base: list[str]) -> dict[str, Any]:
    """Protocols and conversations in one tshark pass (count and time span: `Capinfos.capture_facts`).

    The protocols are every frame's layers (`frame.protocols`), in order of first appearance after
    `frame`: what sharkd's `analyse` lists for the loaded capture. io,phs did not: it misses protocols
    dissected inside others (nas-5gs in ngap, sdp in sip, ipcp) and lists pseudo-protocols
    (tcp.segments, _ws.malformed), and its io,stat probes disagreed with sharkd on has_protocols
    (gtp on tempo_s1ap.pcap, http on an ngtester capture). The conversation tables follow the
    per-frame lines. The cost: `-T fields` builds every frame's tree, 2-2.4x the io,phs pass (58 MB:
    6.8-7.8 s against 2.9-4.4 s on a loaded 2-core machine), on the core beside sharkd's load.
    """
    argv = [*base, "-T", "fields", "-e", "frame.protocols"]
    argv += [a for t in ("sctp", "tcp", "udp", "ip") for a in ("-z", f"conv,{t}")]
    protocols: dict[str, None] = {"frame": None}
    conversations: list[dict[str, Any]] = []
    table: str | None = None
    stats = False  # past the per-frame lines: the taps print after the last frame

    def on_line(line: str) -> None:
        nonlocal table, stats
        if not stats and line.startswith("====="):
            stats = True
        if not stats:
            for name in line.split(":"):
                if name:
                    protocols.setdefault(name)
        elif line.endswith(" Conversations"):
            table = {"IPv4": "IPv4", "SCTP": "SCTP", "TCP": "TCP", "UDP": "UDP"}.get(line.split()[0])
        elif table and (m := _CONV.match(line)):
            conversations.append({
                "proto": table, "a": m.group(1), "b": m.group(2), "frames": int(m.group(9)),
                "bytes": int(float(m.group(10)) * _UNITS[m.group(11)]),
            })

    done = await head(argv, None, on_line=on_line)  # one line per frame: read as it comes, not kept
    warnings: list[str] = []
    if done.returncode != 0 and not (TRUNCATED in done.stderr and len(protocols) > 1):
        messages = [line for line in done.stderr.splitlines() if line and not line.startswith("Running as user")]
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "cannot read the capture: " + "\n".join(messages)[-2000:],
                         exit_code=done.returncode)
    if TRUNCATED in done.stderr:
        warnings.append(f"The file appears to have been {TRUNCATED}: frames up to the cut are shown")
    return {"protocols": list(protocols), "conversations": conversations, "warnings": warnings}


# ---------------------------------------------------------------------------------------------
# What capinfos says about a file: whether it is a capture at all, and its count and time span.

# wiretap opens some files that hold no packets as a "capture" of one record (the whole file):
# JSON, images and other MIME types, PEM (RFC 7468) files, Ruby marshal data, TNEF attachments.
NOT_PACKETS = frozenset({"json", "mime", "rfc7468", "rubymarshal", "ruby_marshal", "tnef"})


@dataclass(frozen=True)
class CaptureFacts:
    """capinfos' own words (TZ=UTC), kept as text: the times and duration carry the capture's
    precision (6 or 9 digits, per packet in a mixed pcapng), which a float would round."""

    file_type: str
    encapsulation: str
    packets: int
    duration: str | None  # seconds, e.g. "1.093128000"; None when the capture has no packet
    start: str | None  # earliest packet, "2026-08-19 11:37:20.142573123"
    end: str | None  # latest packet
    warning: str | None = None

    @property
    def duration_s(self) -> float | None:
        # Decimal -> float rounds once, correctly: repr() gives back the exact decimal of any
        # duration up to 15 significant digits (about 11 days with nanoseconds).
        return float(Decimal(self.duration)) if self.duration is not None else None

    @staticmethod
    def iso(stamp: str | None) -> str | None:
        return stamp.replace(" ", "T", 1) + "Z" if stamp is not None else None


# Above this, capinfos (which reads every record: ~0.03 s at 55 MB, ~0.4 s at 1 GB) is not waited for
# before a call: captype (which only opens the file, ~5 ms) says whether it is a capture.
BIG_FILE = 8 * 2**20
# Set by a call whose answer is the count itself (pcap_info): the check reads it rather than captype.
_facts_wanted: ContextVar[bool] = ContextVar("diagd_pcap_facts_wanted", default=False)


@contextmanager
def facts_wanted() -> Iterator[None]:
    """Within: `Capinfos.check_capture` of any size runs capinfos, split in two halves on two cores for a
    big file (halves.py), for a caller that answers with the count and span (pcap_info): captype's open
    would only come before it, and the call waits for the count either way."""
    token = _facts_wanted.set(True)
    try:
        yield
    finally:
        _facts_wanted.reset(token)


class Capinfos:
    """What capinfos said of each file version (KEEP of them, the least recently asked dropped) and the
    runs going on, one per file version at a time: the back end's (`facts.Wireshark.capinfos`), shared
    by its tools and its captures' sessions."""

    KEEP = 256

    def __init__(self) -> None:
        self._facts: OrderedDict[str, CaptureFacts] = OrderedDict()
        self._counting: dict[str, trio.Event] = {}  # capinfos runs going on, per file version

    def known_facts(self, identity: str) -> CaptureFacts | None:
        """What capinfos said of this file version, if it has been asked already (nothing is run)."""
        return self._facts.get(identity)

    async def check_capture(self, path: Path, identity: str, size: int) -> None:
        """INVALID_ARGUMENT unless the file is a capture of packets, before any worker is started for it.
        A small file gets capinfos (capture_facts, kept for pcap_info); a big one only `captype`, which
        opens it without reading it through: counting a 1 GB file's records takes seconds that a fresh
        capture's first page need not wait for (`begin_count` runs capinfos after the first answer),
        unless the call wants the count (`facts_wanted`: counted first, on cores the capture's start does not
        yet share). A plain pcap or pcapng header the record walk follows is a capture of packets by
        itself (~0.2 ms, where captype starts a process)."""
        if size < BIG_FILE or _facts_wanted.get():
            await self.capture_facts(path, identity, size, split=_facts_wanted.get())
            return
        if identity in self._facts or identity in self._counting:
            return
        if await trio.to_thread.run_sync(recordwalk.is_walkable, path):
            return
        done = await run(["captype", str(path)])
        kind = done.out.strip().rsplit(": ", 1)[-1] if done.returncode == 0 else "unknown"
        if kind == "unknown" or kind in NOT_PACKETS:
            await self.capture_facts(path, identity, size)  # its own words for why not

    def begin_count(self, path: Path, identity: str, size: int) -> None:
        """capinfos on the file in the background (once per file version), for the load's progress in
        frames and the next pcap_info."""
        if identity in self._facts or identity in self._counting:
            return

        async def count() -> None:
            try:
                await self.capture_facts(path, identity, size)
            except Exception:  # a system task must not raise: it would end the daemon
                # DiagdError, or an OSError of a file removed under the walk (seen: FileNotFoundError took
                # the daemon down, trio.TrioInternalError). The call that needs the facts (pcap_info) runs
                # capinfos again and says why.
                pass
        trio.lowlevel.spawn_system_task(count)

    async def capture_facts(self, path: Path, identity: str, size: int, *, split: bool = False) -> CaptureFacts:
        """capinfos on the file (kept per file version): INVALID_ARGUMENT "not a capture file" when it is
        not one. split: a big file is read as two halves on two cores when it can be (halves.py), for a
        caller waiting."""
        while identity in self._counting:  # one capinfos per file version at a time
            await self._counting[identity].wait()
        if identity in self._facts:
            self._facts.move_to_end(identity)
            return self._facts[identity]
        self._counting[identity] = trio.Event()
        try:
            facts = self._facts[identity] = await _capinfos(path, size, split=split)
            if len(self._facts) > self.KEEP:
                self._facts.popitem(last=False)
            return facts
        finally:
            self._counting.pop(identity).set()


async def _walked_cells(path: Path, env: dict[str, str]) -> list[str] | None:
    """The table cells of one capinfos run, from the file's record headers (recordwalk.py; None: not walked)."""
    cells = await recordwalk.count(path, env)
    return [str(path), *cells] if cells is not None else None


async def _split_cells(path: Path, size: int, env: dict[str, str]) -> list[str] | None:
    """The table cells of one capinfos run, from two over the file's halves side by side (None: not cut)."""
    if size < halves.SPLIT_MIN_BYTES or len(os.sched_getaffinity(0)) < 2:
        return None
    try:
        cut = await trio.to_thread.run_sync(halves.plan, path)
        cells = await halves.count(path, env, cut) if cut is not None else None
    except (OSError, ValueError):  # gone or changed under the reads: the one run says what it is
        return None
    return [str(path), *cells] if cells is not None else None


async def _one_run(path: Path, env: dict[str, str]) -> tuple[list[str], str | None]:
    """capinfos' table cells for the file (its name first) and the warning of a file cut short."""
    argv = ["capinfos", "-M", "-T", "-r", "-t", "-E", "-c", "-u", "-a", "-e", str(path)]
    done = await run(argv, env=env)
    out = done.out.strip()
    err = done.stderr.strip()
    warning = None
    if done.returncode != 0:
        if TRUNCATED in err and out:
            warning = f"The file appears to have been {TRUNCATED}: frames up to the cut are shown"
        else:
            message = err.removeprefix("capinfos: ").strip() or f"capinfos exited with status {done.returncode}"
            if "isn't a capture file" in message or "unknown file format" in message.lower():
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"not a capture file: {path} ({message})", path=str(path))
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"cannot read the capture {path}: {message}", path=str(path))
    # The file name (first column) may hold tabs: count the six columns from the right.
    cells = out.splitlines()[-1].rsplit("\t", 6) if out else []
    if len(cells) != 7:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"cannot read the capture {path}: capinfos said {out!r}",
                         path=str(path))
    return cells, warning


async def _capinfos(path: Path, size: int, *, split: bool = False) -> CaptureFacts:
    env = {**os.environ, "TZ": "UTC"}  # capinfos prints local times
    cells = await _walked_cells(path, env)
    if cells is None and split:
        cells = await _split_cells(path, size, env)
    warning = None
    if cells is None:
        cells, warning = await _one_run(path, env)
    _, file_type, encap, count, duration, start, end = cells
    if size == 0:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"not a capture file: {path} is empty (0 bytes)", path=str(path))
    if file_type in NOT_PACKETS or encap in NOT_PACKETS:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"not a capture file: {path} is a {file_type} file, which Wireshark opens as one "
                         "record holding the whole file, not as packets", path=str(path), file_type=file_type)

    def known(text: str) -> str | None:
        return None if text == "n/a" else text

    return CaptureFacts(file_type, encap, int(count) if count.isdigit() else 0, known(duration), known(start),
                        known(end), warning)


# ---------------------------------------------------------------------------------------------
# Field values exactly as `tshark -T fields` prints them.

AGGREGATOR = "\x1f"  # between occurrences of one field; tshark escapes control characters in values


# `-T fields` as every timeline asks it (the standby of any field list takes a list after these).
FIELDS_OPTIONS = ("-T", "fields", "-E", "header=n", "-E", "separator=/t", "-E", "occurrence=a", "-E",
                  f"aggregator={AGGREGATOR}")


def fields_argv(base: list[str], display_filter: str, fields: Sequence[str]) -> list[str]:
    argv = [*base, *(["-Y", display_filter] if display_filter else []), *FIELDS_OPTIONS]
    if any(f.startswith(COLUMN_PREFIX) for f in fields):
        argv += ["-o", column_format_pref()]
    for name in fields:
        argv += ["-e", name]
    return argv


async def field_rows(argv: list[str], want: int | None, *, run: RunHead = head) -> list[list[str]]:
    """Rows of `tshark -T fields` (one list of cells per frame), reading at most `want` rows: tshark
    is stopped once they are in, so an early page does not wait for the end of a big capture."""
    if want is not None:  # rows as they come (-l), not when a pipe buffer of them is full
        argv = [argv[0], "-l", *argv[1:]]
    done = await run(argv, want, max_line=1 << 30)
    rows = [line.split("\t") for line in done.lines]
    if not done.stopped and done.returncode != 0 and not (TRUNCATED in done.stderr and rows):
        messages = [line for line in done.stderr.splitlines() if line and not line.startswith("Running as user")]
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "tshark could not read the field values: "
                         + "\n".join(messages)[-2000:], exit_code=done.returncode)
    return rows


async def export(base: list[str], display_filter: str, output_path: str) -> int:
    """Write the frames matching `display_filter` to `output_path` (pcapng); returns how many
    capinfos counts in it. NOT_FOUND (and no file left behind) when no frame matches."""
    done = await run([*base, "-Y", display_filter, "-w", output_path, "-F", "pcapng"])
    if done.returncode != 0:
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "tshark could not write the sub-capture",
                         stderr=done.stderr[-2000:])
    counted = await run(["capinfos", "-M", "-c", "-T", "-r", output_path])
    fields = counted.out.strip().split("\t")
    packets = int(fields[-1]) if counted.returncode == 0 and fields[-1].isdigit() else 0
    if packets == 0:
        await trio.Path(output_path).unlink(missing_ok=True)
        raise DiagdError(ErrorCode.NOT_FOUND, "no frame matches: nothing to extract", display_filter=display_filter)
    return packets
