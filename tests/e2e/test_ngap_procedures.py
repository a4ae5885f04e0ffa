"""ngap_ue_sessions(view="procedures") against a second, independent answer from `tshark -T fields`.

Every corpus capture (which ones carry NGAP is asked of tshark), a capture of several gNBs that
reuse the same UE ids (built here with mergecap), and the documented failures of the adrian_*
failure-injection runs (MANIFEST.md). Through the real daemon and shim.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_ngap_summaries import CORPUS, call, first_and_last_seconds, gnb_endpoint, ngap_frame_count, \
    ngap_sources, ue_keys
from tests.e2e.test_pcap import make_env
from tests.pcaps import PCAPS, pcap
from tests.support import procedures_oracle
from tests.support.pcapedit import PCAP_MAGICS, keep_sctp_only, readdress_sctp, shift_pcap

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]
GNBS = 4


@pytest.fixture(scope="module")
def procs_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("procsd")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{root}"]\n')
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


async def procedures(daemon: DaemonProcess, path: Path) -> dict[str, Any]:
    return await call(daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures")


def as_found(result: dict[str, Any], listed: list[dict[str, Any]] | None = None) -> list[procedures_oracle.Found]:
    """diagd's instances (all, or those `listed`) as the oracle writes them."""
    keys = ue_keys(result)
    every = listed if listed is not None else [p for u in result["ues"] for p in u["procedures"]]
    return [(keys[p["ue"]], p["procedure"], p.get("pdu_session_id"), p["first_frame"], p["last_frame"],
             p["duration_ms"], p["outcome"], p["cause"]["kind"] if p["cause"] else None,
             p["cause"]["code"] if p["cause"] else None) for p in every]


def check(result: dict[str, Any], path: Path) -> list[procedures_oracle.Found]:
    want = procedures_oracle.answer(path)
    got = as_found(result)
    assert sorted(got, key=repr) == sorted(want, key=repr)
    assert result["procedure_count"] == len(want)
    assert result["incomplete"] == sum(1 for w in want if w[6] == "incomplete")
    # Statistics per procedure type, recomputed from the oracle's instances.
    stats: dict[str, Any] = {}
    for name in sorted({w[1] for w in want}):
        mine = [w for w in want if w[1] == name]
        durations = [w[5] for w in mine if w[5] is not None]
        stats[name] = {"count": len(mine), **{o: sum(1 for w in mine if w[6] == o)
                                              for o in ("success", "reject", "failure", "incomplete")},
                       "p50_ms": procedures_oracle.nearest_rank(durations, 50) if durations else None,
                       "p95_ms": procedures_oracle.nearest_rank(durations, 95) if durations else None,
                       "max_ms": max(durations) if durations else None}
    assert result["statistics"] == stats
    failed = sorted((w for w in want if w[6] in ("reject", "failure")), key=repr)
    assert sorted(as_found(result, result["failed"]), key=repr) == failed
    for u in result["ues"]:
        for p in u["procedures"]:
            assert p["start"].endswith("Z") and p["frames"][0] == p["first_frame"] and p["frames"][-1] == p["last_frame"]
            assert (p["outcome"] == "incomplete") == (p["duration_ms"] is None) == ("why" in p), p
    return want


@pytest.mark.parametrize("name", CORPUS)
async def test_every_corpus_capture_agrees_with_tshark_fields(procs_daemon: DaemonProcess, name: str) -> None:
    path = Path(pcap(name))
    result = await procedures(procs_daemon, path)
    if ngap_frame_count(path) == 0:
        assert result["procedure_count"] == 0 and result["ues"] == [] and result["statistics"] == {}
        assert result["reason"] == "no NGAP over SCTP in the capture"
        return
    want = check(result, path)
    assert want and "reason" not in result
    # The capture's registrations are all there, each closed by an answer or said to be incomplete.
    assert {"Registration", "Authentication"} <= set(result["statistics"])


async def test_documented_failures_show_their_causes(procs_daemon: DaemonProcess) -> None:
    # MANIFEST.md: frame 19 Registration reject #7 (RAN 2).
    result = await procedures(procs_daemon, Path(pcap("adrian_registration_reject.pcap")))
    [reject] = result["failed"]
    assert (reject["procedure"], reject["last_frame"], reject["outcome"], reject["cause"]) == (
        "Registration", 19, "reject", {"kind": "5GMM", "code": 7, "name": "5GS services not allowed"})
    assert reject["ue"].endswith("/amf-2/ran-2")
    # Authentication failure #21 (synch failure), then Registration reject #111.
    result = await procedures(procs_daemon, Path(pcap("adrian_auth_failure.pcap")))
    assert sorted((f["procedure"], f["outcome"], f["cause"]["code"]) for f in result["failed"]) == [
        ("Authentication", "failure", 21), ("Registration", "reject", 111)]
    # PDU session establishment reject 5GSM #67 in frame 29 (DNN otherdnn).
    result = await procedures(procs_daemon, Path(pcap("adrian_pdu_session_reject_other.pcap")))
    assert [(f["procedure"], f["last_frame"], f["outcome"], f["cause"]["kind"], f["cause"]["code"])
            for f in result["failed"]] == [("PDU Session Establishment", 29, "reject", "5GSM", 67)]
    # Second PDU session on SST 2: the AMF answers with 5GMM STATUS #91.
    result = await procedures(procs_daemon, Path(pcap("adrian_pdu_session_reject_slice.pcap")))
    assert [(f["procedure"], f["outcome"], f["cause"]["kind"], f["cause"]["code"]) for f in result["failed"]] == [
        ("PDU Session Establishment", "failure", "5GMM", 91)]
    # UPF not answering PFCP: every establishment rejected with 5GSM #38 (network failure).
    result = await procedures(procs_daemon, Path(pcap("adrian_n4_upf_timeout.pcap")))
    est = result["statistics"]["PDU Session Establishment"]
    assert est["reject"] == est["count"] > 1
    assert {(f["cause"]["kind"], f["cause"]["code"]) for f in result["failed"]} == {("5GSM", 38)}
    # NSSF retargeted: 5GMM STATUS #147 in frames 19, 26, 33.
    result = await procedures(procs_daemon, Path(pcap("adrian_sbi_nssf_reject.pcap")))
    assert [(f["last_frame"], f["outcome"], f["cause"]["code"]) for f in result["failed"]] == [
        (19, "failure", 147), (26, "failure", 147), (33, "failure", 147)]


@pytest.fixture(scope="module")
def several_gnbs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GNBS copies of the corpus' classic-pcap NGAP runs, each on its own gNB address and port, a few
    seconds apart and overlapping, all reusing the same small UE NGAP ids."""
    sources = [p for p in ngap_sources() if p.read_bytes()[:4] in PCAP_MAGICS]
    root = tmp_path_factory.mktemp("gnbs")
    parts = []
    for g in range(GNBS):
        src = sources[g % len(sources)]
        data = keep_sctp_only(bytearray(src.read_bytes()))
        old_ip, old_port = gnb_endpoint(src)
        first, _ = first_and_last_seconds(data)
        shift_pcap(data, 1_800_000_000 + g - first)
        assert readdress_sctp(data, salt=(g + 7) * 0x01010101 & 0xFFFFFFFF, addresses={old_ip: f"10.98.0.{g + 1}"},
                              ports={old_port: 41000 + g})
        part = root / f"gnb_{g}.pcap"
        part.write_bytes(bytes(data))
        parts.append(str(part))
    merged = root / "gnbs.pcap"
    subprocess.run(["mergecap", "-F", "pcap", "-w", str(merged), *parts], check=True, capture_output=True)
    for part in parts:
        os.unlink(part)
    return merged


async def test_several_gnbs_reusing_ue_ids_keep_their_procedures_apart(
        tmp_path_factory: pytest.TempPathFactory, several_gnbs: Path) -> None:
    root = tmp_path_factory.mktemp("gnbsd")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{several_gnbs.parent}"]\n')
    daemon = start_daemon(env)
    try:
        result = await procedures(daemon, several_gnbs)
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)
    want = check(result, several_gnbs)
    assert len(result["associations"]) == GNBS
    # Each copy brings its source's procedures again, on its own gNB.
    sources = [p for p in ngap_sources() if p.read_bytes()[:4] in PCAP_MAGICS]
    assert len(want) == sum(len(procedures_oracle.answer(sources[g % len(sources)])) for g in range(GNBS))
    reused = [u for u in result["ues"] if (u["amf_ue_ngap_id"], u["ran_ue_ngap_id"]) == (1, 1)]
    # The same (AMF id 1, RAN id 1) on several gNBs: one context each (5greplay_oai uses other ids).
    assert len({u["gnb"] for u in reused}) == len(reused) >= 2
    assert all(u["procedures"] for u in reused)
