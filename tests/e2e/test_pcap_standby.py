"""The warm tshark through the daemon: a daemon with standbys (the default) and one with `warm_tshark =
false` give the same first answers on fresh captures (rows with their provisional marks, timelines,
totals), the warm daemon's were served by standbys (diagd_status says so), and the cold one has none."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import Call, session
from tests.pcaps import PCAPS, PCAPS_EXTRA, corpus

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

# First calls on a fresh capture that an early single pass answers (first_page.loading_safe filters).
ASKS: list[tuple[str, dict[str, Any]]] = [
    ("pcap_frames_by_filter", {"display_filter": "ip", "limit": 50}),
    ("pcap_frames_by_filter", {"display_filter": "udp.port == 53 || sctp", "limit": 20}),
    ("pcap_timeline", {"display_filter": "ip", "fields": ["ip.src", "ip.dst", "ip.len", "udp.srcport"],
                       "limit": 30}),
]
TIMING = {"queue_s", "duration_s", "elapsed_s", "took_s", "load_progress"}


def daemon_with(tmp_path: Path, name: str, extra: str) -> DaemonProcess:
    env = make_env(tmp_path / name, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}"]\ncall_timeout_s = 300\n'
                                     f"[pcap]\nmax_loaded = 2\n{extra}")
    return start_daemon(env)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    warm, cold = daemon_with(tmp_path, "warm", ""), daemon_with(tmp_path, "cold", "warm_tshark = false\n")
    yield warm, cold
    for daemon in (warm, cold):
        daemon.stop()


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answer.items() if k not in TIMING and k != "source"}


async def standbys(call: Call) -> list[dict[str, Any]]:
    status = await call("diagd_status")
    return [a for a in status.get("actors", []) if a["kind"] == "tshark-standby"]


async def first_answers(call: Call, captures: list[Path], *, warm: bool) -> list[dict[str, Any]]:
    """The first answer of each ask on each capture, the capture fresh for each (its actor stopped)."""
    answers = []
    for path in captures:
        for tool, args in ASKS:
            if warm:  # a daemon in use: the standbys wait (the timeline's once its field list was asked)
                with trio.fail_after(60):
                    while not all(s["details"]["waiting"] for s in await standbys(call)):
                        await trio.sleep(0.05)
            answer = await call(tool, pcap_path=str(path), **args)
            assert not answer["_is_error"], answer
            answers.append(comparable(answer))
            for actor in (await call("diagd_status"))["actors"]:
                if actor["kind"] == "pcap":
                    await call("diagd_stop_actor", actor_id=actor["id"])
    return answers


async def test_warm_and_cold_daemons_give_the_same_first_answers_and_the_warm_ones_come_from_standbys(
        daemons: tuple[DaemonProcess, DaemonProcess]) -> None:
    found = corpus()
    if not found:
        pytest.skip(f"no real captures in {PCAPS}")
    captures = found[:: max(1, len(found) // 8)]  # eight of the corpus, spread over both folders
    warm_daemon, cold_daemon = daemons
    async with session(warm_daemon) as warm_call, session(cold_daemon) as cold_call:
        warm = await first_answers(warm_call, captures, warm=True)
        cold = await first_answers(cold_call, captures, warm=False)
        served = sum(s["details"]["served"] for s in await standbys(warm_call))
        assert await standbys(cold_call) == []
    # A small capture may load before its first page is in (then sharkd answers, exactly): pages are
    # compared where both daemons answered the same way, which is most of them.
    pairs = [(one, two) for one, two in zip(warm, cold, strict=True) if one.get("served_by") == two.get("served_by")]
    for one, two in pairs:
        assert one == two
    early = [one for one, _ in pairs if "single pass" in str(one.get("served_by"))]
    # Each argv's first run may start its standby instead (two argvs: the packet list, the timeline's).
    assert len(early) >= len(warm) // 2 and served >= len(early) - 2
