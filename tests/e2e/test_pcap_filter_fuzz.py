"""Display filters sharkd or tshark refuse, sent to the filter-taking pcap tools through the real path
(SDK client -> shim -> daemon -> sharkd) on a real capture, compared with `tshark -Y`.

Each answer is a result or a coded INVALID_FILTER / INVALID_ARGUMENT, never ACTOR_FAILED; a filter
`tshark -Y` refuses is INVALID_FILTER from every tool; a filter tshark takes gives the frames tshark
gives; and the same capture answers a good filter afterwards, its actor never having crashed.
The scripted-sharkd unit test of every sharkd error code: tests/actors/pcap/test_sharkd_errors.py."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import call, make_env
from tests.pcaps import PCAPS, pcap

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

CAPTURE = "5greplay_oai.pcap"  # 753 frames: SCTP/NGAP, PFCP, GTP-U, HTTP/1.1 SBI over TCP
FILTERS = [
    "tcp.port in {7777 8282 8889}",  # a set without commas: sharkd's check and frames refuse it apart
    "tcp.port in {80 8080}",
    "tcp.port in {7777 8282",  # unbalanced brace
    "(ip && udp",  # unbalanced parenthesis
    "nosuch.field == 1",  # unknown field
    "frame.len[0:2] == 01:02",  # a slice on a non-bytes field
    "tcp.port[0] == 1",
    "ip.addr == 1.2.3.999",
    'frame contains "abc',  # unterminated string
    "ip.addr ==",
    "tcp.port in {" + ",".join(str(p) for p in range(300)) + "}",  # a big set sharkd takes
    "tcp.port in {" + ",".join(str(p) for p in range(1000)) + "}",  # beyond sharkd's 2 KiB request line
    "tcp.port in {80,8080} && !(ip.addr == 10.0.0.1)",
    "sctp && ngap",
]
TOOLS: dict[str, dict[str, Any]] = {
    "pcap_frames_by_filter": {"limit": 500},
    "pcap_timeline": {"fields": ["ip.src"]},
    "pcap_stats": {"kind": "io"},
    "pcap_sequence_diagram": {},
}
CODED = {"INVALID_FILTER", "INVALID_ARGUMENT"}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("fuzzd")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}"]\n')
    running = start_daemon(env)
    yield running
    running.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


def tshark_frames(display_filter: str) -> list[int] | None:
    """The frames `tshark -2 -Y` matches (two passes, as sharkd), or None when tshark refuses the filter."""
    done = subprocess.run(["tshark", "-n", "-2", "-r", pcap(CAPTURE), "-Y", display_filter, "-T", "fields",
                           "-e", "frame.number"], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        return None
    return [int(line) for line in done.stdout.split()]


async def test_refused_filters_are_coded_errors_and_the_capture_goes_on(daemon: DaemonProcess) -> None:
    path = pcap(CAPTURE)
    for display_filter in FILTERS:
        expected = tshark_frames(display_filter)
        for tool, extra in TOOLS.items():
            answer = await call(daemon, tool, pcap_path=path, display_filter=display_filter, **extra)
            where = f"{tool} {display_filter[:60]!r}: {answer.get('code')} {str(answer.get('message'))[:200]}"
            if answer["_is_error"]:
                assert answer["code"] in CODED, where
            if expected is None:  # tshark -Y refuses it: every tool says INVALID_FILTER
                assert answer["_is_error"] and answer["code"] == "INVALID_FILTER", where
            elif len(display_filter) <= 1800:  # tshark takes it, and it fits sharkd's request line
                assert not answer["_is_error"], where
                if tool == "pcap_frames_by_filter":
                    assert answer["total"] == len(expected), where
                    assert [f["number"] for f in answer["frames"]] == expected[:500], where
    # The same capture, its actor never restarted, answers a good filter as tshark does.
    good = "sctp && ngap"
    expected = tshark_frames(good)
    assert expected
    again = await call(daemon, "pcap_frames_by_filter", pcap_path=path, display_filter=good, limit=500)
    assert not again["_is_error"] and [f["number"] for f in again["frames"]] == expected
    log = (daemon.env.root / "daemon.log").read_text()
    assert "ACTOR_FAILED" not in log and "actor restarting" not in log and "actor failed" not in log
