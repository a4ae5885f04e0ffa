"""Wireshark's own names and tables, read once per test run from `tshark -G values`, `-G decodes`, `-G fields`.

A second source for the numbers diagd's NGAP / 5G NAS code goes by: a message type, procedure code, IE id or
cause value is looked up here by the name Wireshark gives it (TS 24.501 / TS 38.413 spellings), so a test
can write its expectation as a name from the spec and never read diagd's own constants back.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

# The protocols these names are read for (`-G values` lists every dissector's: 90 MB, seconds to parse).
PROTOCOLS = ("ngap.", "nas_5gs.", "sctp.", "e212.")


def _tshark(*args: str) -> str:
    """tshark's answer, only its lines about PROTOCOLS, kept on disk per tshark binary (the mutation gate runs
    these tests once per mutant)."""
    binary = Path(shutil.which("tshark") or "tshark").resolve()
    stat = binary.stat()
    cached = Path(tempfile.gettempdir()) / f"diagd-wireshark-names-{os.getuid()}" / \
        f"{'_'.join(a.strip('-') for a in args)}-{stat.st_size}-{stat.st_mtime_ns}.txt"
    if cached.exists():
        return cached.read_text()
    out = "".join(line for line in subprocess.run(["tshark", *args], check=True, capture_output=True,
                                                 text=True).stdout.splitlines(keepends=True)
                  if any(p in line for p in PROTOCOLS))
    cached.parent.mkdir(exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}")
    partial.write_text(out)
    partial.replace(cached)  # whole or not at all
    return out


@functools.cache
def _values() -> dict[str, dict[int, str]]:
    out: dict[str, dict[int, str]] = {}
    for line in _tshark("-G", "values").splitlines():
        cells = line.split("\t")
        if len(cells) == 4 and cells[0] == "V" and re.fullmatch(r"-?(0x[0-9a-fA-F]+|[0-9]+)", cells[2]):
            out.setdefault(cells[1], {})[int(cells[2], 0)] = cells[3]
    return out


def names(field: str) -> dict[int, str]:
    """{value: name} of a field's value string."""
    return dict(_values()[field])


def code(field: str, name: str) -> int:
    """The one value a field's value string names `name`."""
    found = [value for value, said in _values()[field].items() if said == name]
    assert len(found) == 1, (field, name, found)
    return found[0]


@functools.cache
def decodes(dissector: str) -> dict[str, frozenset[int]]:
    """{table: values} under which `dissector` is registered (`tshark -G decodes`), e.g. ngap.proc.sout."""
    out: dict[str, set[int]] = {}
    for line in _tshark("-G", "decodes").splitlines():
        cells = line.split("\t")
        if len(cells) == 3 and cells[2] == dissector and cells[1].isdigit():
            out.setdefault(cells[0], set()).add(int(cells[1]))
    return {table: frozenset(values) for table, values in out.items()}


@functools.cache
def fields() -> frozenset[str]:
    """Every field name Wireshark registers (`tshark -G fields`)."""
    return frozenset(cells[2] for line in _tshark("-G", "fields").splitlines()
                     if len(cells := line.split("\t")) > 2 and cells[0] == "F")
