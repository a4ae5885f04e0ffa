"""Captures built from real frames for pcap_stats' fast tests, kept under the tree cache by recipe (built
once: the recorded sharkd answers and tshark's are cached by the file's identity).

`build`: frames sitting where io,stat's binning is decided: on interval boundaries, within the half
microsecond the tap rounds to, out of time order, before the first frame (a negative relative time); real
frames of a corpus capture (their bytes untouched) written, in the order given, into a classic pcap with
nanosecond timestamps, frame i at BASE + times_ns[i] (no frame at all: an empty capture).

`without_frames`: a corpus capture less some frames (`editcap`), e.g. a request whose response stays."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from tests.support.pcapedit import PCAP_MAGICS, packets, write_ns_pcap
from tests.support.sharkd_trees import CACHE

BASE_S = 1_700_000_000  # 2023-11-14T22:13:20Z, any whole second


def build(name: str, source: Path, times_ns: list[int]) -> Path:
    """`name`: frame i is source packet i (cycling) at BASE_S + times_ns[i] ns, in list order."""
    data = bytearray(source.read_bytes())
    if bytes(data[:4]) not in PCAP_MAGICS:
        raise ValueError(f"{source.name}: a classic pcap is needed")
    found = list(packets(data))
    key = hashlib.sha256(repr((source.name, len(data), times_ns)).encode()).hexdigest()[:12]
    out = CACHE / f"io-{name}-{key}.pcap"
    if out.exists():
        return out
    cycled = [found[i % len(found)] for i in range(len(times_ns))]
    records = [(BASE_S * 10**9 + at, data[p.offset:p.offset + p.caplen])
               for at, p in zip(times_ns, cycled, strict=True)]
    return write_ns_pcap(out, found[0].linktype, records)


def without_frames(source: Path, frames: list[int]) -> Path:
    """`source` less those frames (editcap deletes them; the rest keep their bytes and times)."""
    key = hashlib.sha256(repr((source.name, source.stat().st_size, frames)).encode()).hexdigest()[:12]
    out = CACHE / f"cut-{key}-{source.name}"
    if not out.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{os.getpid()}.tmp.{out.name}")
        subprocess.run(["editcap", str(source), str(tmp), *map(str, frames)], check=True, capture_output=True,
                       timeout=120)
        tmp.replace(out)
    return out
