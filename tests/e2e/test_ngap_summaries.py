"""ngap_ue_sessions and ngap_pdu_session_summary against a second, independent answer.

Every capture of the shared corpus is checked (which ones carry NGAP is asked of tshark, not
listed here), plus a capture built here of a core test-suite run with dozens of gNBs: time-shifted
copies of the corpus' NGAP captures, each gNB on its own address and port, SCTP verification tags
retagged so Wireshark sees new associations, and four gNBs restarting their association on the
same address and port. Every copy reuses the same small AMF/RAN UE NGAP ids, which is what
merged UE contexts of different gNBs before. The second answer comes from `tshark -T fields`
(tests/support/ngap_oracle.py) and must agree exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.actors.pcap.test_ngap_fields import CANNOT_TELL, assert_shape, compare_answer, compare_fields
from tests.actors.pcap.test_ngap_left_out import undecoded
from tests.conftest import DIAGD, DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.pcaps import PCAPS, PCAPS_EXTRA, corpus, pcap
from tests.support import ngap_fields_oracle, ngap_oracle, pcap_oracle
from tests.support.built_captures import MERGES, merged
from tests.support.pcapedit import PCAP_MAGICS, keep_sctp_only, packets, readdress_sctp, shift_pcap

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

CORPUS = corpus() or [PCAPS / "(no corpus)"]  # both corpora: shared/pcaps and shared/pcaps-extra
MULTI_GNB = "multi-gnb run"
COPIES = 32
RESTARTING = 8  # copies 0..7: four gNBs, each restarting its SCTP association once
BASE_EPOCH = 1_800_000_000  # every copy is moved to start near this time, a few seconds apart
HANG_GUARD_S = 600  # not a measurement: only stops a test that hangs


@pytest.fixture(scope="module")
def ngap_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("ngapd")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}", "{root}"]\n')
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


async def call(daemon: DaemonProcess, tool: str, **args: Any) -> dict[str, Any]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
    async with Client(params, mode="legacy") as client:
        with trio.fail_after(HANG_GUARD_S):
            result = await client.call_tool(tool, args)
    payload: dict[str, Any] = json.loads(result.content[0].text)
    assert not result.is_error, payload
    return payload


def tshark_text(path: Path, argv: list[str]) -> str:
    """What a reference tool run prints for this capture (this process's environment), kept on disk by the
    capture's bytes, the tshark version, the argv and the Wireshark configuration (tests/support/pcap_oracle)."""
    def run() -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return pcap_oracle.cached_text(path, [*argv, pcap_oracle.config_key()], run)


def ngap_frame_count(path: Path) -> int:
    out = tshark_text(path, ["tshark", "-r", str(path), "-n", "-Y", "ngap && sctp", "-T", "fields", "-e",
                             "frame.number"])
    return len(out.split())


def ngap_sources() -> list[Path]:
    """The corpus captures that carry NGAP over SCTP, as tshark says."""
    if not PCAPS.is_dir():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    found = [p for p in sorted(PCAPS.glob("*.pcap*")) if ngap_frame_count(p) > 0]
    if not found:
        pytest.skip(f"no capture in {PCAPS} carries NGAP")
    return found


# ---------------------------------------------------------------------------------------------
# The multi-gNB capture


@dataclass
class Copy:
    source: Path
    gnb: str  # new ip:port of its gNB
    start: int


def gnb_endpoint(path: Path) -> tuple[str, int]:
    """The gNB's address and port: the sender of NGSetupRequest, else the side not on 38412."""
    for flt in ("ngap.procedureCode == 21 && ngap.NGAP_PDU == 0", "ngap && sctp.dstport == 38412"):
        out = tshark_text(path, ["tshark", "-r", str(path), "-n", "-Y", flt, "-T", "fields", "-e", "ip.src",
                                 "-e", "sctp.srcport"]).split()
        if out:
            return out[0], int(out[1])
    raise AssertionError(f"{path.name}: no gNB side found")


def first_and_last_seconds(data: bytearray) -> tuple[int, int]:
    endian = PCAP_MAGICS[bytes(data[:4])]
    stamps = [struct.unpack_from(endian + "I", data, p.header)[0] for p in packets(data)]
    return min(stamps), max(stamps)


@pytest.fixture(scope="module")
def multi_gnb(tmp_path_factory: pytest.TempPathFactory, ngap_daemon: DaemonProcess) -> tuple[Path, list[Copy]]:
    sources = [p for p in ngap_sources() if p.read_bytes()[:4] in PCAP_MAGICS]  # classic pcap: byte edits
    root = Path(ngap_daemon.env.root)
    parts, copies = [], []
    previous_end = 0
    for g in range(COPIES):
        src = sources[g % len(sources)]
        data = keep_sctp_only(bytearray(src.read_bytes()))
        old_ip, old_port = gnb_endpoint(src)
        site = g // 2 if g < RESTARTING else g  # the gNB (address and port) this copy runs on
        ip, port = f"10.99.{site // 250}.{site % 250 + 1}", 40000 + site
        first, last = first_and_last_seconds(data)
        # A restart comes after the same gNB's previous association ended; other gNBs overlap in time.
        start = previous_end + 2 if g < RESTARTING and g % 2 else BASE_EPOCH + 3 * g
        shift_pcap(data, start - first)
        previous_end = start + (last - first) + 1
        changed = readdress_sctp(data, salt=(g + 1) * 0x01010101 & 0xFFFFFFFF, addresses={old_ip: ip},
                                 ports={old_port: port})
        assert changed, f"{src.name} has no Ethernet/IPv4/SCTP packet"
        part = root / f"gnb_{g:02d}.pcap"
        part.write_bytes(bytes(data))
        parts.append(str(part))
        copies.append(Copy(src, f"{ip}:{port}", start))
    merged = root / "multi_gnb.pcap"
    subprocess.run(["mergecap", "-F", "pcap", "-w", str(merged), *parts], check=True, capture_output=True)
    for part in parts:
        os.unlink(part)
    return merged, copies


# ---------------------------------------------------------------------------------------------
# Comparing


async def compare(daemon: DaemonProcess, path: Path) -> tuple[dict[str, Any], dict[str, Any], ngap_oracle.Answer]:
    """Both answers as the daemon serves them, against both oracles (the same checks as the fast in-process test)."""
    ues = await call(daemon, "ngap_ue_sessions", pcap_path=str(path))
    sessions = await call(daemon, "ngap_pdu_session_summary", pcap_path=str(path))
    want = ngap_oracle.answer(path)
    assert_shape(ues, sessions, served=True)
    compare_answer(ues, sessions, want)
    # And every field (frames, TMSI, PLMN, S-NSSAI, tunnels, DNN, UE IP, QFIs, release) as the daemon serves it.
    compare_fields(ues, sessions, ngap_fields_oracle.answer(path))
    return ues, sessions, want


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
async def test_every_corpus_capture_agrees_with_tshark_fields(ngap_daemon: DaemonProcess, path: Path) -> None:
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    if path.name in CANNOT_TELL:
        with pytest.raises(ngap_oracle.OracleCannotTell, match=CANNOT_TELL[path.name]):
            ngap_oracle.answer(path)
        return
    if ngap_frame_count(path) == 0:
        # No NGAP: the answer is empty and says why, it is not silently empty.
        ues = await call(ngap_daemon, "ngap_ue_sessions", pcap_path=str(path))
        sessions = await call(ngap_daemon, "ngap_pdu_session_summary", pcap_path=str(path))
        assert ues["ue_count"] == 0 and ues["ngap_pdus"] == 0 and ues["failed_ues"] == []
        assert ues["reason"] == sessions["reason"] == "no NGAP over SCTP in the capture"
        assert sessions["session_count"] == 0
        return
    ues, sessions, want = await compare(ngap_daemon, path)
    if not want.ues:  # NGAP, but only non-UE procedures (NGSetup, NGReset ...)
        assert ues["reason"] == "no UE-associated NGAP PDU (only non-UE procedures such as NGSetup)"
    for tool, key, whole in (("ngap_ue_sessions", "ues", ues), ("ngap_pdu_session_summary", "sessions", sessions)):
        await assert_paged(ngap_daemon, path, tool, key, whole)


PAGED = {"ngap_ue_sessions": ("ues", "failed_ues", "linked_ue_groups", "not_linked"),
         "ngap_pdu_session_summary": ("sessions", "rejected", "incomplete")}


async def assert_paged(daemon: DaemonProcess, path: Path, tool: str, key: str, whole: dict[str, Any]) -> None:
    """Two pages of the per-UE (per-session) list and of each list of some of them are the whole lists,
    the rest of the answer unchanged."""
    lists = PAGED[tool]
    assert whole["offset"] == 0 and not whole["has_more"], whole
    assert whole["totals"] == {name: len(whole[name]) for name in lists}, whole["totals"]
    longest = max(len(whole[name]) for name in lists)
    items, half = whole[key], longest // 2 + 1
    first = await call(daemon, tool, pcap_path=str(path), limit=half)
    second = await call(daemon, tool, pcap_path=str(path), offset=half, limit=half)
    for name in lists:
        assert first[name] + second[name] == whole[name], (path.name, name)
    assert first["has_more"] == (longest > half) and not second["has_more"], path.name
    assert first["totals"] == second["totals"] == whole["totals"]
    rest = {k: v for k, v in whole.items()
            if k not in (*lists, "offset", "has_more", "reason", "source", "cached")}
    assert {k: v for k, v in first.items() if k in rest} == rest, path.name
    if 0 < len(items) <= half:
        assert second[key] == [] and second["reason"] == f"offset {half} is past the last of {len(items)} {key}"


async def test_many_gnbs_reusing_ue_ids_stay_apart(ngap_daemon: DaemonProcess,
                                                   multi_gnb: tuple[Path, list[Copy]]) -> None:
    path, copies = multi_gnb
    ues, sessions, _ = await compare(ngap_daemon, path)
    # By construction: one association per copy (restarts on the same ports included), and each
    # copy brings its source's UE contexts, failures and sessions again.
    per_source = {c.source: ngap_oracle.answer(c.source) for c in copies}
    assert len(ues["associations"]) == COPIES
    assert len({a["gnb"] for a in ues["associations"]}) == COPIES - RESTARTING // 2
    assert ues["ue_count"] == sum(len(per_source[c.source].ues) for c in copies)
    assert sessions["established_count"] == sum(len(per_source[c.source].established) for c in copies)
    assert sessions["rejected_count"] == sum(len(per_source[c.source].rejected) for c in copies)
    assert len(ues["failed_ues"]) == sum(sum(1 for f in per_source[c.source].failures.values() if f) for c in copies)
    # The old bug: the same (AMF id, RAN id) on many gNBs was one UE with another UE's AMF id.
    reused = [u for u in ues["ues"] if (u["amf_ue_ngap_id"], u["ran_ue_ngap_id"]) == (1, 1)]
    assert len({u["association"] for u in reused}) == len(reused) > COPIES // 2
    # Each gNB's UEs are on that gNB.
    assert {u["gnb"] for u in ues["ues"]} == {c.gnb for c in copies}


@pytest.mark.parametrize(("cause_byte", "cause", "abnormal"), [
    (0x40, "normal-release", False), (0x48, "deregister", False), (0x44, "authentication-failure", True)])
async def test_a_release_is_a_failure_only_with_an_abnormal_cause(ngap_daemon: DaemonProcess, cause_byte: int,
                                                                  cause: str, abnormal: bool) -> None:
    # Real data, one byte changed: frame 21 of the registration-reject run is the
    # UEContextReleaseCommand of UE (AMF 2, RAN 2), cause nas: normal-release. Its Cause is one PER
    # byte (choice nas = 010, extension bit, 2-bit value), so nas causes can be swapped in place.
    data = bytearray(Path(pcap("adrian_registration_reject.pcap")).read_bytes())
    command = list(packets(data))[20]
    assert data[command.offset + 77:command.offset + 82] == bytes.fromhex("000f400140")  # id-Cause, nas: 0
    data[command.offset + 81] = cause_byte
    path = Path(ngap_daemon.env.root) / f"release_{cause}.pcap"
    path.write_bytes(bytes(data))
    ues, _, _ = await compare(ngap_daemon, path)  # the oracle, by cause codes, agrees
    ue = next(u for u in ues["ues"] if (u["amf_ue_ngap_id"], u["ran_ue_ngap_id"]) == (2, 2))
    release = [(f["frame"], f["kind"], f["code"], f["cause"], f["why"]) for f in ue["failures"] if f["frame"] == 21]
    assert release == ([(21, "NGAP", 1, cause, "abnormal release cause in UEContextRelease")] if abnormal else [])
    assert [(f["frame"], f["code"]) for f in ue["failures"] if f["frame"] != 21] == [(19, 7)]  # the reject stays
    assert [u["ran_ue_ngap_id"] for u in ues["failed_ues"]] == [2]


async def test_every_summary_names_the_sbi_it_left_undecoded(ngap_daemon: DaemonProcess) -> None:
    """One run's N2, N4 and SBI views merged (Open5GS: SBI is HTTP/2 on tcp/7777, a port Wireshark does not know).
    Without decode_as each NGAP summary says how many conversations it could not read, where, and the rule that
    includes them (the conversations and ports: tests/actors/pcap/test_ngap_left_out.py's tshark-fields reading);
    with that rule nothing is left out and the procedures view links the SBI calls."""
    source = merged("sandbox-n2-n4-sbi")
    if not source.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    path = Path(ngap_daemon.env.root) / "sandbox_n2_n4_sbi.pcap"
    shutil.copyfile(source, path)
    left = undecoded(source, [])  # with and without the preface (MANIFEST's rule for the merged capture)
    assert left and {port for _, port in left} == {7777}
    warning = (f"SBI left out: {len(left)} TCP conversations carry HTTP/2 that tshark did not decode (a port it "
               f"does not know), by port: tcp/7777 ({len(left)}); the SBI calls among them (CreateSMContext, "
               "N1N2MessageTransfer, Nsmf_PDUSession Create) are missing from n4_sbi (view=procedures). To include "
               "them: tcp/7777: decode_as=tcp.port==7777,http2")
    answers = [await call(ngap_daemon, "ngap_ue_sessions", pcap_path=str(path)),
               await call(ngap_daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures"),
               await call(ngap_daemon, "ngap_pdu_session_summary", pcap_path=str(path))]
    assert [a["warnings"][-1:] for a in answers] == [[warning]] * 3
    assert all(a["warnings"].count(warning) == 1 for a in answers)
    assert not [m for p in ues_procedures(answers[1]) for m in p.get("n4_sbi", []) if m["interface"] == "SBI"]
    rule = MERGES["sandbox-n2-n4-sbi"][1]
    decoded = [await call(ngap_daemon, "ngap_ue_sessions", pcap_path=str(path), decode_as=rule),
               await call(ngap_daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures", decode_as=rule),
               await call(ngap_daemon, "ngap_pdu_session_summary", pcap_path=str(path), decode_as=rule)]
    assert not [w for a in decoded for w in a["warnings"] if w.startswith("SBI left out")]
    assert [m for p in ues_procedures(decoded[1]) for m in p.get("n4_sbi", []) if m["interface"] == "SBI"]


def ues_procedures(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for u in answer["ues"] for p in u["procedures"]]
