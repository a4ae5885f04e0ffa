"""Frames cut from a capture by their file offsets (index/narrow.py) against editcap keeping the same
frames: tshark prints both files alike, frame by frame, arrival times and bytes (`-t e -x`). Every corpus capture
the cut serves, the built files of the record walk's tests (big-endian, nanosecond), and the files it
must refuse (a block between packets a cut would lose, a file not the index's)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from diagd.actors.pcap.index import narrow
from diagd.actors.pcap.shark import recordwalk
from tests.pcaps import corpus
from tests.support import pcap_oracle as oracle
from tests.support.capinfos_captures import built

pytestmark = [
    pytest.mark.skipif(shutil.which("editcap") is None, reason="editcap (Wireshark) is not installed"),
    pytest.mark.skipif(not recordwalk.available(), reason="diagd was installed without its C record walker"),
]
__all__ = ["built"]  # the fixture, used by name

# Interfaces of several resolutions or a time offset are cut too: the times are copied, never read.
CUT = ["ns.pcap", "be.pcap", "out_of_order.pcap", "alike_interfaces_be.pcapng", "two_resolutions.pcapng",
       "two_resolutions_be.pcapng", "milliseconds.pcapng", "tsoffset.pcapng", "tie.pcapng", "rounded.pcapng",
       "power_of_two.pcapng"]
REFUSED = ["late_interface.pcapng", "two_sections.pcapng", "simple_packet.pcapng", "unnormalized.pcap",
           "cut_short.pcap"]
EDITCAP_SELECTIONS = 500  # editcap keeps at most 512 selections (a range is one)


def offsets(path: Path) -> list[int]:
    """Each frame's offset in the file as tshark reads it (kept on disk by the capture's content, argv and
    environment: pcap_oracle.cached_text)."""
    argv = ["tshark", "-n", "-r", str(path), "-o", "frame.show_file_off:TRUE", "-T", "fields", "-e", "frame.file_off"]
    out = oracle.cached_text(path, [*argv, oracle.config_key()],
                             lambda: subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return [int(x) for x in out.split()]


def printed(path: Path) -> str:
    """Each frame's summary with its arrival time and all its bytes (what a cut must keep)."""
    return subprocess.run(["tshark", "-n", "-r", str(path), "-t", "e", "-x"], capture_output=True, text=True,
                          check=True).stdout


def chosen(count: int) -> list[int]:
    """Frame numbers 1.. of a capture of `count`: runs of three kept, two left out, and the last."""
    picked = [n for n in range(1, count + 1) if n % 5 in (1, 2, 3)][:EDITCAP_SELECTIONS * 3]
    return sorted({*picked, count})


def file_type(path: Path) -> str:
    """The capture's file type as editcap -F names it (editcap writes pcapng unless told)."""
    said = subprocess.run(["capinfos", "-t", str(path)], capture_output=True, text=True, check=True).stdout
    return "pcapng" if "pcapng" in said else "nsecpcap" if "nanosecond" in said else "pcap"


def editcap_kept(path: Path, numbers: list[int], out: Path) -> None:
    runs: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(f"{start}-{prev}" if prev > start else str(start))
        if n is not None:
            start = prev = n
    subprocess.run(["editcap", "-F", file_type(path), "-r", str(path), str(out), *runs], check=True,
                   capture_output=True)


def check_cut(path: Path, tmp_path: Path) -> None:
    offs = offsets(path)
    numbers = chosen(len(offs))
    cut = tmp_path / f"cut{path.suffix}"
    written = narrow.cut(path, [offs[n - 1] for n in numbers], len(offs), cut)
    assert written == cut.stat().st_size
    kept = tmp_path / f"kept{path.suffix}"
    editcap_kept(path, numbers, kept)
    assert printed(cut) == printed(kept), path.name


@pytest.mark.parametrize("path", [p for p in corpus() if p.stat().st_size < 20 << 20], ids=lambda p: p.name)
def test_a_cut_prints_as_editcap_keeping_the_same_frames(path: Path, tmp_path: Path) -> None:
    try:
        check_cut(path, tmp_path)
    except narrow.Uncuttable as exc:  # the walk's rule, checked below on built files
        assert recordwalk.read_layout(path) is None or recordwalk.walk(path, recordwalk.read_layout(path)) is None, exc


@pytest.mark.parametrize("name", CUT)
def test_built_captures_are_cut_as_editcap_keeps_them(built: dict[str, Path], name: str, tmp_path: Path) -> None:
    check_cut(built[name], tmp_path)


@pytest.mark.parametrize("name", REFUSED)
def test_a_file_whose_blocks_a_cut_would_lose_is_not_cut(built: dict[str, Path], name: str, tmp_path: Path) -> None:
    with pytest.raises(narrow.Uncuttable):
        narrow.cut(built[name], [], 1, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_offsets_of_another_file_version_are_refused(built: dict[str, Path], tmp_path: Path) -> None:
    path = built["be.pcap"]
    offs = offsets(path)
    with pytest.raises(narrow.Uncuttable, match="records, its index"):
        narrow.cut(path, offs, len(offs) + 1, tmp_path / "a")
    with pytest.raises(narrow.Uncuttable, match="not after the last"):
        narrow.cut(path, [offs[1], offs[0]], len(offs), tmp_path / "b")
    with pytest.raises(narrow.Uncuttable, match=r"no record|cut short"):
        narrow.cut(path, [offs[-1] + 8], len(offs), tmp_path / "c")
