"""Wireshark's own statistics, read from `tshark -q -z <tap>` and `tshark -T fields` output: the oracle
pcap_stats is compared with (tests/e2e/test_pcap_stats.py through the daemon, tests/actors/pcap/
test_stats_fast.py in-process). Never imports diagd."""

from __future__ import annotations

import functools
import hashlib
import re
import subprocess
import tempfile
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from tests.support.ngap_oracle import disk_cached

SECTIONS = {"Errors": "Error", "Warns": "Warning", "Notes": "Note", "Chats": "Chat", "Comments": "Comment"}
UNITS = {"bytes": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3}
HANG_GUARD_S = 300  # not a measurement: only stops a tshark that hangs


@functools.cache
def _version() -> str:
    return subprocess.run(["tshark", "-v"], capture_output=True, text=True, timeout=60).stdout.splitlines()[0]


def tshark(path: Path, *args: str) -> str:
    """`tshark -r path -n -2 args` with an empty Wireshark config (default preferences), kept on disk."""
    kind = "stats-" + hashlib.sha256(repr((_version(), args)).encode()).hexdigest()[:16]

    def run(p: Path) -> str:
        with tempfile.TemporaryDirectory(prefix="tshark-conf-") as conf:
            done = subprocess.run(["tshark", "-r", str(p), "-n", "-2", *args], capture_output=True, text=True,
                                  check=False, timeout=HANG_GUARD_S,
                                  env={"PATH": "/usr/bin:/bin", "TZ": "UTC", "WIRESHARK_CONFIG_DIR": conf,
                                       "HOME": conf})
        assert done.returncode == 0, (p, args, done.stderr[-2000:])
        return done.stdout

    return disk_cached(path, kind, run)


def expert(text: str) -> Counter[tuple[str, str, str, str]]:
    """`-z expert`: {(severity, group, protocol, summary): count}."""
    counts: Counter[tuple[str, str, str, str]] = Counter()
    severity = None
    for line in text.splitlines():
        if head := re.match(r"^(\w+) \((\d+)\)$", line):
            severity = SECTIONS[head.group(1)]
        elif severity and (row := re.match(r"^\s*(\d+)\s+(\S+)\s+(.+?)  (.*)$", line)):
            counts[(severity, row.group(2), row.group(3).strip(), row.group(4))] += int(row.group(1))
    return counts


def same_bytes(ours: int, number: str, unit: str) -> bool:
    """tshark prints sizes of 10 kB and more in kB, cut to whole units."""
    return ours == int(number) if unit == "bytes" else ours // UNITS[unit] == int(number)


def conversations(text: str) -> dict[tuple[str, str, str], tuple[Any, ...]]:
    """`-z conv,P` rows by (A, B, relative start): one address pair can hold several conversations (UDPTL,
    RTP). Each: (<- frames, number, unit, -> frames, number, unit, total frames, number, unit, duration)."""
    rows = {}
    size = r"(\d+) (bytes|kB|MB|GB)"
    for line in text.splitlines():
        m = re.match(rf"^(\S+)\s+<->\s+(\S+)\s+(\d+) {size}\s+(\d+) {size}\s+(\d+) {size}\s+([\d.]+)\s+([\d.]+)\s*$",
                     line)
        if m:
            g = m.groups()
            rows[(g[0], g[1], g[11])] = (int(g[2]), g[3], g[4], int(g[5]), g[6], g[7], int(g[8]), g[9], g[10], g[12])
    return rows


def endpoints(text: str, protocol: str) -> dict[str, list[int]]:
    """`-z endpoints,P`: {address (address:port for a transport): [frames, bytes, tx frames, tx bytes,
    rx frames, rx bytes]}."""
    found = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and re.match(r"^\d+(\.\d+){3}$", cells[0]) and all(c.isdigit() for c in cells[1:]):
            address = cells[0] if protocol == "ip" else f"{cells[0]}:{cells[1]}"
            found[address] = [int(c) for c in cells[-6:]]
    return found


def io(text: str) -> list[tuple[float, int, int]]:
    """`-z io,stat,S[,F]`: (interval start in s, frames, bytes) per interval (a filter longer than the
    table leaves a `  |` after each row)."""
    return [(float(m.group(1)), int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"^\|\s*([\d.]+) <> \s*(?:[\d.]+|Dur)\s*\|\s*(\d+) \|\s*(\d+) \|(?:\s*\|)?$", text, re.M)]


def io_every_interval(path: Path, interval_ms: int, display_filter: str
                      ) -> tuple[list[tuple[float, int, int]], tuple[int, int]]:
    """`-z io,stat` of the capture, every interval, and the (frames, bytes) of every frame the filter
    matches (`-T fields`). tshark prints the intervals up to the capture's duration (its latest relative
    time, rounded to us): when that is a whole number of intervals, the interval starting there, holding
    the latest frames, is left out of its table (and of its totals); pcap_stats prints it (every frame is
    in a row), so it is added here from the totals."""
    seconds = f"{interval_ms / 1000:g}"
    theirs = io(tshark(path, "-q", "-z", f"io,stat,{seconds}" + (f",{display_filter}" if display_filter else "")))
    fields = tshark(path, *(["-Y", display_filter] if display_filter else []), "-T", "fields", "-e", "frame.len")
    total = (len(fields.split()), sum(int(n) for n in fields.split()))
    latest = max((Decimal(t) for t in tshark(path, "-T", "fields", "-e", "frame.time_relative").split()),
                 default=Decimal(0))
    latest_us = int((latest * 10**6).to_integral_value(rounding=ROUND_HALF_UP))
    shown = (sum(f for _, f, _ in theirs), sum(b for _, _, b in theirs))
    if latest_us % (interval_ms * 1000) == 0 and latest_us and len(theirs) == latest_us // (interval_ms * 1000):
        theirs.append((latest_us / 10**6, total[0] - shown[0], total[1] - shown[1]))
    return theirs, total


def diameter_srt(text: str) -> dict[str, tuple[int, str, str, str, str]]:
    """`-z diameter,srt`: {procedure: (calls, min, max, avg, sum as printed, 6 decimals)}."""
    return {m.group(1): (int(m.group(2)), *m.group(3, 4, 5, 6)) for m in re.finditer(
        r"^\s+\d+\s+(\S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", text, re.M)}
