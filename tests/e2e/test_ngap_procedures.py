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

from tests.actors.pcap.test_ngap_procedures_model import PROCEDURES_CANNOT_TELL, check
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_ngap_summaries import (
    CORPUS,
    call,
    first_and_last_seconds,
    gnb_endpoint,
    ngap_frame_count,
    ngap_sources,
    tshark_text,
)
from tests.e2e.test_pcap import make_env
from tests.pcaps import PCAPS, PCAPS_EXTRA, pcap
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
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}", "{root}"]\n')
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


async def procedures(daemon: DaemonProcess, path: Path) -> dict[str, Any]:
    return await call(daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures")


@pytest.mark.parametrize("name", CORPUS)
async def test_every_corpus_capture_agrees_with_tshark_fields(procs_daemon: DaemonProcess, name: str) -> None:
    path = Path(pcap(name))
    result = await procedures(procs_daemon, path)
    if ngap_frame_count(path) == 0:
        assert result["procedure_count"] == 0 and result["ues"] == [] and result["statistics"] == {}
        assert result["reason"] == "no NGAP over SCTP in the capture"
        return
    if path.name in PROCEDURES_CANNOT_TELL:
        with pytest.raises(procedures_oracle.OracleCannotTell, match=PROCEDURES_CANNOT_TELL[path.name]):
            procedures_oracle.answer(path)
        return
    want = check(result, path)
    # Every procedure type the oracle found has its statistics, and no other (a capture of NGAP
    # without procedures, e.g. only an NG reset, has none and says why).
    assert set(result["statistics"]) == {found[1] for found in want}
    assert ("reason" in result) == (not want)
    if path.parent == PCAPS:  # the first corpus: every capture holds registrations
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


def tshark_lines(path: Path, *args: str) -> list[list[str]]:
    out = tshark_text(path, ["tshark", "-r", str(path), "-n", "-2", *args, "-T", "fields", "-E", "occurrence=f"])
    return [line.split("\t") for line in out.splitlines()]


@pytest.mark.parametrize(("parts", "decode_as"), [
    (("adrian_sandbox_n2.pcap", "adrian_sandbox_n4.pcap", "adrian_sandbox_sbi.pcap"), "tcp.port==7777,http2"),
    (("adrian_n4_upf_timeout.pcap", "adrian_n4_upf_timeout_n4.pcap", "adrian_n4_upf_timeout_sbi.pcap"),
     "tcp.port==7777,http2"),
    (("5greplay_oai.pcap",), None)])
async def test_pdu_session_establishments_carry_their_n4_and_sbi_messages(
        procs_daemon: DaemonProcess, parts: tuple[str, ...], decode_as: str | None) -> None:
    # The N2, N4 and SBI views of one run, merged here (5greplay_oai has all three, SBI on HTTP/1.1).
    path = Path(pcap(parts[0]))
    if len(parts) > 1:
        path = Path(procs_daemon.env.root) / f"merged_{parts[0]}"
        subprocess.run(["mergecap", "-F", "pcap", "-w", str(path), *(pcap(p) for p in parts)], check=True,
                       capture_output=True)
    args: dict[str, Any] = {"decode_as": decode_as} if decode_as else {}
    result = await call(procs_daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures", **args)
    check(result, path)
    dec = ["-d", decode_as] if decode_as else []
    # N4: every PFCP Session Establishment Request, its response (two-pass response_in) and UE IP.
    pfcp = {int(r[0]): (int(r[1]) if r[1] else None) for r in tshark_lines(
        path, "-Y", "pfcp.msg_type == 50", "-e", "frame.number", "-e", "pfcp.response_in")}
    h2 = tshark_lines(path, *dec, "-Y", 'http2.headers.path matches "^/(nsmf-pdusession/v1/sm-contexts|namf-comm/'
                      'v1/ue-contexts/[^/]+/n1-n2-messages)$"', "-e", "frame.number")
    h1 = tshark_lines(path, "-Y", 'http.request.method == "POST" && !gtp && http.request.uri matches '
                      '"^/(nsmf-pdusession/v1/sm-contexts|namf-comm/v1/ue-contexts/[^/]+/n1-n2-messages)$"',
                      "-e", "frame.number", "-e", "http.response_in")
    sbi = {int(r[0]) for r in h2} | {int(r[0]) for r in h1}
    est = [p for u in result["ues"] for p in u["procedures"] if p["procedure"] == "PDU Session Establishment"]
    attached = [m for p in est for m in p["n4_sbi"]]
    assert result["n4_sbi"] == {"n4_sbi_messages": len(pfcp) + len(sbi), "unattached": 0}
    assert sorted(m["frame"] for m in attached if m["interface"] == "N4") == sorted(pfcp)
    assert sorted(m["frame"] for m in attached if m["interface"] == "SBI") == sorted(sbi)
    for m in attached:
        if m["interface"] == "N4":
            assert m["response_frame"] == pfcp[m["frame"]]
        assert (m["response_frame"] is None) == (m["latency_ms"] is None) == ("why" in m)
    for p in est:  # each attached message lies in its establishment's window, or is linked by UE IP
        for m in p["n4_sbi"]:
            assert p["first_frame"] <= m["frame"] <= p["last_frame"] or m["linked_by"].startswith("UE IPv4"), m
    if "upf_timeout" in parts[0]:
        # MANIFEST.md: the UPF never answers; every establishment is rejected with 5GSM #38.
        assert all(m["response_frame"] is None for m in attached if m["interface"] == "N4")
        assert all(p["outcome"] == "reject" and p["cause"]["code"] == 38 for p in est)
    else:
        assert all(p["outcome"] == "success" for p in est)
        assert all(any(m["interface"] == "N4" and m["linked_by"].startswith("UE IPv4") for m in p["n4_sbi"])
                   for p in est)
