"""One-shot tshark passes, for the first request on a capture while its sharkd worker loads.

sharkd's `load` is itself a full pass over the file, so the first question on a fresh capture
would cost two passes. Running the one tshark pass that answers it, side by side with the load on
the other core, answers in about the time of a plain `tshark -r FILE -Y FILTER`; later calls go to
the warm worker. Output is parsed from tshark's text, so only stable formats are used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from diagd.protocol.errors import DiagdError, ErrorCode

_UNITS = {"bytes": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
_CONV = re.compile(
    r"^(\S+)\s+<->\s+(\S+)\s+(\d+)\s+([\d.]+)\s+(bytes|kB|MB|GB)\s+(\d+)\s+([\d.]+)\s+(bytes|kB|MB|GB)"
    r"\s+(\d+)\s+([\d.]+)\s+(bytes|kB|MB|GB)\s+")


def base_argv(path: Path, decode_as: Sequence[str], preferences: Sequence[tuple[str, str]]) -> list[str]:
    argv = ["tshark", "-r", str(path), "-n"]
    for rule in decode_as:
        argv += ["-d", rule]
    for name, value in preferences:
        argv += ["-o", f"{name}:{value}"]
    return argv


TRUNCATED = "cut short in the middle of a packet"


async def _run(argv: list[str], warnings: list[str] | None = None) -> str:
    # TZ=UTC: capinfos prints local times.
    done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False,
                                  env={**os.environ, "TZ": "UTC"})
    err = done.stderr.decode(errors="replace")
    if done.returncode != 0 and not (TRUNCATED in err and done.stdout):  # a cut-short file still has data
        messages = [line for line in err.splitlines() if line and not line.startswith("Running as user")]
        message = "\n".join(messages)[-2000:]
        if "-Y" in argv and ("filter" in message.lower() or "unexpected" in message or "not a valid" in message):
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {message}",
                             display_filter=argv[argv.index("-Y") + 1])
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"cannot read the capture: {message}",
                         exit_code=done.returncode)
    if warnings is not None and TRUNCATED in err:
        warnings.append(f"The file appears to have been {TRUNCATED}: frames up to the cut are shown")
    return done.stdout.decode(errors="replace")


async def frames(base: list[str], display_filter: str) -> list[dict[str, Any]]:
    """The packet list of a filter. `-T tabs` (the summary line, tab-separated) costs what a plain
    `-Y` pass costs; `-T fields -e _ws.col.*` would build columns for every frame (3x slower)."""
    argv = [*base, *(["-Y", display_filter] if display_filter else []), "-T", "tabs"]
    rows = []
    for line in (await _run(argv)).splitlines():
        c = [cell.strip() for cell in line.split("\t")]
        if len(c) >= 8 and c[0].isdigit():  # No., Time, Source, arrow, Destination, Protocol, Length, Info
            rows.append({"number": int(c[0]), "time_relative": float(c[1] or 0), "src": c[2], "dst": c[4],
                         "protocol": c[5], "length": int(c[6] or 0), "info": " ".join(c[7:]).strip()})
    return rows


async def info(base: list[str], path: Path, probe: Sequence[str]) -> dict[str, Any]:
    """Protocols, conversations, packet count and time span in one tshark pass (+ capinfos).

    io,phs lists the protocol hierarchy but misses protocols dissected inside others (nas-5gs
    inside ngap), so an io,stat column per `probe` protocol counts its frames in the same pass.
    """
    stats_argv = [*base, "-q", "-z", "io,phs", "-z", "io,stat,0," + ",".join(probe)]
    stats_argv += [a for t in ("sctp", "tcp", "udp", "ip") for a in ("-z", f"conv,{t}")]
    text = ""
    span = ""
    warnings: list[str] = []

    async def stats() -> None:
        nonlocal text
        text = await _run(stats_argv, warnings)

    async def times() -> None:
        nonlocal span
        span = await _run(["capinfos", "-M", "-c", "-a", "-e", "-T", "-r", str(path)])

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stats)
            nursery.start_soon(times)
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None  # the first failure says what is wrong with the file
    protocols: dict[str, None] = {}
    conversations: list[dict[str, Any]] = []
    table = None
    probed: dict[str, int] = {}
    for line in text.splitlines():
        if "frames:" in line and "bytes:" in line:
            protocols.setdefault(line.split()[0])
        elif line.startswith("|") and "<>" in line and not probed:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            counts = cells[1::2]  # after the interval: frames, bytes, frames, bytes ...
            probed = {p: int(n) for p, n in zip(probe, counts, strict=False) if n.isdigit()}
        elif line.endswith(" Conversations"):
            table = {"IPv4": "IPv4", "SCTP": "SCTP", "TCP": "TCP", "UDP": "UDP"}.get(line.split()[0])
        elif table and (m := _CONV.match(line)):
            conversations.append({
                "proto": table, "a": m.group(1), "b": m.group(2), "frames": int(m.group(9)),
                "bytes": int(float(m.group(10)) * _UNITS[m.group(11)]),
            })
    fields = span.strip().splitlines()[-1].split("\t") if span.strip() else []
    first = _epoch(fields[2]) if len(fields) >= 4 else None
    last = _epoch(fields[3]) if len(fields) >= 4 else None
    count = int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else 0
    for name, frames_with in probed.items():
        if frames_with:
            protocols.setdefault(name)
    return {"protocols": list(protocols), "conversations": conversations, "warnings": warnings,
            "frames": count, "first": first, "last": last}


def _epoch(text: str) -> float | None:
    try:
        stamp = datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
    except ValueError:
        return None
    return stamp.timestamp()
