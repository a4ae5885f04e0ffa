"""Pages with no row, in a real daemon: pcap_text_search, pcap_frames_by_filter and pcap_timeline with
`limit` on a capture without packets (a pcapng of its section header only, a classic pcap of its file
header only), on a capture whose filter matches nothing, past the last match, and on a capture still
loading (a fresh 35 MB capture, whose pages come from a single tshark pass). Each answer is a clean
one: no rows, and a reason (the capture holds no frames, which protocols are there, the offset is past
the end). The capture's actor stays up: the next call works, nothing restarted it, nothing failed it.

An empty single pass used to crash the actor (single_pass_text.frames_of on no output: ACTOR_FAILED,
and five in a row stopped it)."""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import Call, session
from tests.pcaps import PCAPS, pcap

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

NOTHING = "sctp.port == 1"  # a protocol the captures below carry, a value none of their frames has


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon of its own: every capture is fresh to it."""
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{PCAPS}", "{tmp_path}"]\ncall_timeout_s = 120\n')
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


def without_packets(tmp_path: Path) -> list[Path]:
    """A pcapng of its section header only, and a classic pcap of its file header only."""
    source = pcap("adrian_sandbox_n2.pcap")
    made = []
    for name, kind in (("empty.pcapng", "pcapng"), ("empty.pcap", "pcap")):
        out = tmp_path / name
        subprocess.run(["editcap", "-F", kind, "-r", source, str(out), "0"], check=True, capture_output=True)
        made.append(out)
    assert made[0].stat().st_size <= 100 and made[1].stat().st_size == 24
    return made


def pages(display_filter: str, offset: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """The three tools, each asking a page (`limit`)."""
    flt = {"display_filter": display_filter} if display_filter else {}
    return [("pcap_text_search", {"query": "Registration", "limit": 10, "offset": offset, **flt}),
            ("pcap_frames_by_filter", {"limit": 10, "offset": offset, **flt}),
            ("pcap_timeline", {"fields": ["frame.number", "ip.src"], "limit": 10, "offset": offset, **flt})]


def rows_of(tool: str, answer: dict[str, Any]) -> list[Any]:
    return list(answer["matches" if tool == "pcap_text_search" else "frames" if tool == "pcap_frames_by_filter"
                       else "rows"])


def reason(tool: str, answer: dict[str, Any]) -> str:
    return str(answer["note"] if tool == "pcap_text_search" else answer["hint"])


async def empty_page(call: Call, path: Path, tool: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The page, asked twice (the second may be the loaded capture's or the cached answer): each a clean
    answer without rows; the first answer and its reason."""
    first: dict[str, Any] | None = None
    for _ in range(2):
        answer = await call(tool, pcap_path=str(path), **args)
        assert not answer["_is_error"], (path.name, tool, args, answer)
        assert rows_of(tool, answer) == [] and answer["has_more"] is False, (path.name, tool, answer)
        first = first or answer
    assert first is not None
    return first, reason(tool, first)


async def alive(daemon: DaemonProcess, call: Call, path: Path) -> None:
    """The next call on the capture works, and no actor was restarted or failed, nor met a bug."""
    info = await call("pcap_info", pcap_path=str(path))
    assert not info["_is_error"], info
    status = await call("diagd_status")
    actors = [a for a in status["actors"] if a["kind"] == "pcap"]
    assert actors and all(a["restarts"] == 0 and a["last_error"] is None for a in actors), actors
    log = (daemon.env.root / "daemon.log").read_text()
    for sign in ("ACTOR_FAILED", "INTERNAL_ERROR", "actor restarting", "actor failed", "actor request failed"):
        assert sign not in log, sign


async def test_a_capture_without_packets_answers_every_page_empty_with_a_reason(
        daemon: DaemonProcess, tmp_path: Path) -> None:
    async with session(daemon) as call:
        for path in without_packets(tmp_path):
            for tool, args in pages(""):
                answer, why = await empty_page(call, path, tool, args)
                assert answer.get("frames_total", answer.get("total")) == 0
                # The timeline's fields make its filter (ip.src: not in this capture at all).
                assert ("not in this capture at all: ip" if tool == "pcap_timeline"
                        else "the capture holds no frames") in why, (tool, why)
            for tool, args in pages(NOTHING):
                _, why = await empty_page(call, path, tool, args)
                assert ("nothing to search" if tool == "pcap_text_search" else "not in this capture at all: sctp"
                        ) in why, (tool, why)
            await alive(daemon, call, path)


async def test_a_filter_matching_nothing_and_an_offset_past_the_end_answer_empty_pages_with_a_reason(
        daemon: DaemonProcess, tmp_path: Path) -> None:
    path = Path(pcap("adrian_sandbox_n2.pcap"))  # 44 frames, NGAP over SCTP
    async with session(daemon) as call:
        for tool, args in pages(NOTHING):
            _, why = await empty_page(call, path, tool, args)
            assert ("no frame matches the filter" if tool == "pcap_text_search"
                    else "present in the capture but no frame matches the whole filter: sctp") in why, (tool, why)
        for tool, args in pages("sctp", offset=1000):
            answer, why = await empty_page(call, path, tool, args)
            assert answer.get("frames_total", answer.get("total")) == 44
            assert "offset 1000 is past the last of the 44 frames matching the filter" in why, (tool, why)
        await alive(daemon, call, path)


async def test_a_capture_still_loading_answers_empty_pages_with_a_reason(
        daemon: DaemonProcess, bigger: Path, tmp_path: Path) -> None:
    loading = 0
    async with session(daemon) as call:
        for i, (tool, args) in enumerate([*pages(NOTHING), *pages("frame.number < 5", offset=20)]):
            fresh = tmp_path / f"fresh-{i}.pcapng"  # a file no worker has loaded: its first call comes while it loads
            shutil.copyfile(bigger, fresh)
            answer, why = await empty_page(call, fresh, tool, args)
            loading += "while sharkd loads" in str(answer.get("served_by"))
            if args["offset"]:
                assert "offset 20 is past the last of the 4 frames matching the filter" in why, (tool, why)
            else:
                assert ("no frame matches the filter" if tool == "pcap_text_search"
                        else "no frame matches the whole filter: sctp") in why, (tool, why)
            await alive(daemon, call, fresh)
    assert loading >= 3, "fewer than three pages were answered while their capture loaded"


def no_bug_met(daemon: DaemonProcess, actors: list[dict[str, Any]]) -> None:
    assert actors and all(a["restarts"] == 0 and a["last_error"] is None for a in actors), actors
    log = (daemon.env.root / "daemon.log").read_text()
    for sign in ("ACTOR_FAILED", "INTERNAL_ERROR", "actor restarting", "actor failed", "actor request failed"):
        assert sign not in log, sign


async def test_a_capture_removed_under_its_calls_answers_or_says_so_and_breaks_nothing(
        daemon: DaemonProcess, bigger: Path, tmp_path: Path) -> None:
    """The file goes while it loads: each later page is a clean answer (what was read) or a coded error
    naming the file, never a bug; the actor serves the next capture."""
    async with session(daemon) as call:
        for i, (tool, args) in enumerate(pages("frame.number < 5")):
            doomed = tmp_path / f"doomed-{i}.pcapng"
            shutil.copyfile(bigger, doomed)
            first = await call(tool, pcap_path=str(doomed), **args)
            assert not first["_is_error"], (tool, first)
            doomed.unlink()
            for _ in range(3):
                later = await call(tool, pcap_path=str(doomed), **args)
                if later["_is_error"]:
                    assert later["code"] in ("FILE_NOT_FOUND", "NOT_FOUND", "BACKEND_UNAVAILABLE"), later
                    assert str(doomed.name) in later["message"] or "removed" in later["message"], later
        status = await call("diagd_status")
        no_bug_met(daemon, [a for a in status["actors"] if a["kind"] == "pcap"])
        kept = tmp_path / "kept.pcapng"
        shutil.copyfile(bigger, kept)
        after = await call("pcap_info", pcap_path=str(kept))
        assert not after["_is_error"], after


def records_of(classic: Path) -> tuple[bytes, bytes]:
    """A classic pcap's records (its 24-byte header left out), cut in two at a record's boundary."""
    data = classic.read_bytes()
    order = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    offset, boundaries = 24, []
    while offset < len(data):
        boundaries.append(offset)
        offset += 16 + struct.unpack_from(f"{order}I", data, offset + 8)[0]
    middle = boundaries[len(boundaries) // 2]
    return data[24:middle], data[middle:]


async def test_a_capture_growing_between_calls_answers_each_page_cleanly(
        daemon: DaemonProcess, tmp_path: Path) -> None:
    """Frames appended to the same file between calls (as a capture being written): every page is a clean
    answer, empty ones with a reason, and no bug is met."""
    source = pcap("adrian_sandbox_n2.pcap")
    growing, rest = tmp_path / "growing.pcap", tmp_path / "rest.pcap"
    subprocess.run(["editcap", "-F", "pcap", "-r", source, str(growing), "1-20"], check=True, capture_output=True)
    subprocess.run(["editcap", "-F", "pcap", "-r", source, str(rest), "21-400"], check=True, capture_output=True)
    async with session(daemon) as call:
        for step in range(3):
            for tool, args in [*pages(NOTHING), *pages("", offset=10)]:
                answer = await call(tool, pcap_path=str(growing), **args)
                assert not answer["_is_error"], (step, tool, answer)
                if not rows_of(tool, answer):
                    assert reason(tool, answer), (step, tool, answer)
            if step < 2:  # append whole records, as a writer does (the file header stays the first one)
                with growing.open("ab") as f:
                    f.write(records_of(rest)[step])
        status = await call("diagd_status")
        no_bug_met(daemon, [a for a in status["actors"] if a["kind"] == "pcap"])
