"""The NGAP UE contexts, their procedures and PDU sessions of an indexed capture (index/ngap_views.py)
against the loaded capture's, on every corpus capture that carries NGAP (the procedures view with the
PFCP and SBI rows it links, read by tshark from a cut: index/core_rows.py).

Two real daemons: one answers from the capture's index (sharkd reads only the SCTP frames cut from the
file: `served_by` says so), of all frames and of those a filter it translates selects; the other has
no index and loads the whole capture in sharkd, the path whose verdicts the NGAP tests hold to
Wireshark's fields. Every key of both answers must be equal, but where they came from. Then a
restarted daemon answers from the views and PDUs stored beside the index, and a file a cut would lose
a block of (an interface described after a packet) is answered by the loaded capture.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagd.actors.pcap.index.ngap_pdus import PDUS_FILE, VIEW_FILE
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import session
from tests.e2e.test_pcap_index import captures, decode_args
from tests.pcaps import PCAPS, PCAPS_EXTRA
from tests.support import ngap_captures as without_sctp
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed"),
]

# The three views of the one NGAP model (the procedures view with its PFCP and SBI rows, read from a cut too).
VIEWS: dict[str, tuple[str, dict[str, Any]]] = {
    "contexts": ("ngap_ue_sessions", {}), "procedures": ("ngap_ue_sessions", {"view": "procedures"}),
    "pdu_sessions": ("ngap_pdu_session_summary", {})}
# Filters the index translates (index/filters.py): the model of the frames they select.
FILTERS = ("frame.number > 20", "sctp.srcport == 38412")
# ... on these captures (a filter takes the whole capture's PDUs of the frames it selects: the same reading).
FILTERED = {"oaifed_5gcn-deployment-omec-gnbsim.pcapng", "adrian_sandbox_n2.pcap", "5greplay_oai.pcap",
            "ngtester_chain_free5gc_pathswitch_then_release_amf_ngap_nas_sbi.pcap"}
SBI_PORT = "tcp.port==7777,http2"  # the adrian_sandbox run's SBI (MANIFEST.md)
CONFIG = f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}"]\ncall_timeout_s = 300\n'


def ngap_captures() -> list[Path]:
    return [p for p in captures() if "ngap" in oracle.layers(p)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Captures whose NGAP depends on frames without SCTP (tests/support/ngap_captures.py)."""
    source = PCAPS / "adrian_sandbox_n2.pcap"
    if not source.exists():
        pytest.skip(f"{source.name} is not in the corpus")
    folder = tmp_path_factory.mktemp("built")
    merged = folder / "n2_n4_sbi.pcap"  # the N2, N4 and SBI views of one run (SBI on HTTP/2, port 7777)
    subprocess.run(["mergecap", "-F", "pcap", "-w", str(merged), *(str(PCAPS / f"adrian_sandbox_{view}.pcap")
                                                                    for view in ("n2", "n4", "sbi"))],
                   check=True, capture_output=True)
    return {"ip_fragments": without_sctp.ip_fragments(source, folder / "ip_fragments.pcap"),
            "wlan_fragments": without_sctp.wlan_fragments(source, folder / "wlan_fragments.pcap"),
            "n2_n4_sbi": merged}


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory, built: dict[str, Path]
            ) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    """(a daemon that indexes, one that never does)."""
    started = []
    folder = next(iter(built.values())).parent
    config = f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}", "{folder}"]\ncall_timeout_s = 300\n'
    try:
        for name in ("indexed", "loaded"):
            env = make_env(tmp_path_factory.mktemp(name), config)
            started.append((start_daemon(env), env))
        yield started[0][0], started[1][0]
    finally:
        for daemon, env in started:
            daemon.stop()
            shutil.rmtree(env.runtime, ignore_errors=True)


def compared(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without where it came from (and whether the actor had it cached)."""
    return {k: v for k, v in answer.items() if k not in ("source", "served_by", "cached", "_is_error")}


async def answers(daemon: DaemonProcess, path: Path, *, index: bool, **args: Any) -> dict[str, dict[str, Any]]:
    decoding = decode_args(path) or ({"decode_as": [SBI_PORT]} if path.name == "n2_n4_sbi.pcap" else {})
    async with session(daemon) as call:
        if index:
            built = await call("pcap_index", pcap_path=str(path), wait_s=240, **decoding)
            assert built["state"] == "ready", built
        return {view: await call(tool, pcap_path=str(path), **decoding, **args, **extra)
                for view, (tool, extra) in VIEWS.items()}


@pytest.mark.parametrize("path", ngap_captures(), ids=lambda p: p.name)
async def test_ngap_models_from_the_index_equal_the_loaded_captures(
        daemons: tuple[DaemonProcess, DaemonProcess], path: Path) -> None:
    indexed, loaded = daemons
    filtered = [{"display_filter": f} for f in FILTERS] if path.name in FILTERED else []
    for args in ({}, {"null_decipher": False}, *filtered):
        from_index = await answers(indexed, path, index=True, **args)
        from_load = await answers(loaded, path, index=False, **args)
        for view in VIEWS:
            got, want = from_index[view], from_load[view]
            assert not got["_is_error"] and got.get("served_by", "").startswith("index"), (view, got)
            assert "served_by" not in want, want
            assert compared(got) == compared(want), (view, args)


@pytest.mark.parametrize("name", ["ip_fragments", "wlan_fragments"])
async def test_frames_without_sctp_that_ngap_depends_on_are_cut_too(
        daemons: tuple[DaemonProcess, DaemonProcess], built: dict[str, Path], name: str) -> None:
    """IP fragments (no SCTP layer) and 802.11 fragments (no IP header) before the frames reassembling
    them: a cut without them would lose an association and number the others wrong."""
    indexed, loaded = daemons
    from_index = await answers(indexed, built[name], index=True)
    from_load = await answers(loaded, built[name], index=False)
    for view in VIEWS:
        assert from_index[view].get("served_by", "").startswith("index"), from_index[view]
        assert compared(from_index[view]) == compared(from_load[view]), view
    associations = from_load["contexts"]["associations"]
    assert associations and all(a.get("ngap_pdus") for a in associations), associations


def late_interface(source: Path, out: Path) -> None:
    """`source` (a pcapng of one section, little-endian) with a copy of its first interface block
    described again after its first packet: a block a cut would lose."""
    data = source.read_bytes()
    at, idb, first_packet = 0, b"", None
    while at < len(data):
        kind, length = struct.unpack_from("<II", data, at)
        if kind == 1 and not idb:
            idb = data[at:at + length]
        if kind == 6 and first_packet is None:
            first_packet = at + length
        at += length
    assert idb and first_packet is not None
    out.write_bytes(data[:first_packet] + idb + data[first_packet:])


async def test_procedures_linked_to_n4_and_sbi_from_the_index_equal_the_loaded_captures(
        daemons: tuple[DaemonProcess, DaemonProcess], built: dict[str, Path]) -> None:
    """PDU session establishments with their PFCP and SBI (HTTP/2) messages attached: the rows tshark read
    from the PFCP, HTTP and HTTP/2 frames cut from the file link the same messages as the whole file's."""
    indexed, loaded = daemons
    from_index = await answers(indexed, built["n2_n4_sbi"], index=True)
    from_load = await answers(loaded, built["n2_n4_sbi"], index=False)
    for view in VIEWS:
        assert from_index[view]["served_by"].startswith("index"), from_index[view]
        assert compared(from_index[view]) == compared(from_load[view]), view
    linked = from_load["procedures"]["n4_sbi"]
    assert linked["n4_sbi_messages"] > 0 and linked["unattached"] == 0, linked
    assert "tshark the PFCP, HTTP and HTTP/2 frames" in from_index["procedures"]["served_by"]


async def test_restarted_daemon_reads_stored_pdus_and_an_uncuttable_file_is_loaded(tmp_path: Path) -> None:
    found = [p for p in ngap_captures() if p.suffix == ".pcapng"]
    if not found:
        pytest.skip("no pcapng capture carrying NGAP in the corpus")
    path = found[0]
    odd = tmp_path / "captures" / f"late-interface-{path.name}"
    odd.parent.mkdir()
    late_interface(path, odd)
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}", "{odd.parent}"]\n'
                                   "call_timeout_s = 300\n")
    first = start_daemon(env)
    try:
        before = await answers(first, path, index=True)
        late = await answers(first, odd, index=True)
        async with session(first) as call:  # response times too: the index cannot cut it, the loaded capture pairs
            srt = await call("pcap_stats", pcap_path=str(odd), kind="srt", protocol="sip")
        assert not srt["_is_error"] and "cut from the file" not in srt["method"], srt
        assert srt["reason"] == "protocol sip is not in this capture", srt
    finally:
        first.stop()
    stored = list((env.state / "pcap" / "index").glob(f"*/{PDUS_FILE.format('*', '*')}"))
    assert len(stored) == 1, stored  # the odd file's PDUs came from the loaded capture: none stored
    views = sorted(p.name.split("-")[1] for p in stored[0].parent.glob(VIEW_FILE.format("*", "*", "*")))
    assert views == ["pdu_sessions", "procedures", "ue_sessions"], views  # what a restarted daemon answers from
    for view in VIEWS:
        assert "served_by" not in late[view], late[view]
        assert compared(late[view]) == compared(before[view])
    second = start_daemon(env)
    try:
        after = await answers(second, path, index=False)
    finally:
        second.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)
    for view in VIEWS:
        assert after[view]["served_by"].startswith("index") and compared(after[view]) == compared(before[view])
