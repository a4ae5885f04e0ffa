"""One procedure model behind every NGAP view, and every outcome decided by a rule of rules.TABLE.

Through the real daemon: on every capture of both shared corpora that carries NGAP, the contexts
view, the procedures view and the PDU session summary give each procedure instance the same
outcome and rule. Each rule row is then shown on a real capture where the corpus has the case, or
on a capture built here from real frames (one byte changed, a frame dropped) where it has not.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagd.actors.pcap.ngap.rules import RULES
from diagd.actors.pcap.ngap.sessions import STATUS_BY_RULE
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_ngap_summaries import call, ngap_frame_count
from tests.e2e.test_pcap import make_env
from tests.pcaps import PCAPS
from tests.support.pcapedit import packets

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]
EXTRA = PCAPS.parent / "pcaps-extra"
FOLDERS = [d for d in (PCAPS, EXTRA) if d.is_dir()]
CAPTURES = sorted(p for d in FOLDERS for p in d.glob("*.pcap*"))

# Rule row -> a corpus capture that has the case (and the instance's first frame).
IN_CORPUS = {
    "registration-accept": ("pcaps/adrian_sandbox_n2.pcap", 9),
    "registration-reject": ("pcaps-extra/aaronshi_n2.pcap", 26),
    "authentication-response": ("pcaps/adrian_sandbox_n2.pcap", None),
    "authentication-failure": ("pcaps/adrian_auth_failure.pcap", 10),
    "security-mode-complete": ("pcaps/adrian_sandbox_n2.pcap", None),
    "service-accept": ("pcaps-extra/ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap", 35),
    "service-reject": ("pcaps-extra/ngtester_chain_oai_initue_then_release_amf_ngap_nas_sbi.pcap", 9),
    "deregistration-accept": ("pcaps-extra/oaifed_5gcn-basic-deployment-nrf.pcap", 721),
    "pdu-setup-response": ("pcaps/adrian_sandbox_n2.pcap", 19),
    "pdu-reject": ("pcaps/adrian_pdu_session_reject_other.pcap", 27),
    "pdu-5gmm-status": ("pcaps/adrian_pdu_session_reject_slice.pcap", 35),
    "release-complete": ("pcaps-extra/oaifed_5gcn-basic-deployment-nrf.pcap", 684),
    "handover-request-ack": ("pcaps-extra/ngtester_open5gs_ho_window_p21_p09_amf_ngap_nas_sbi.pcap", 12),
    "path-switch-ack": ("pcaps-extra/ngtester_chain_free5gc_pathswitch_then_release_amf_ngap_nas_sbi.pcap", 13),
    "ue-context-release-complete": ("pcaps-extra/aaronshi_n2.pcap", 28),
    "unanswered": ("pcaps-extra/ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap", 31),
}
# Rows shown on a capture built from real frames below.
BUILT = {"deregistration-switch-off", "registration-auth-reject"}
# Rows neither corpus has a case of, and no capture is built for yet (issue 22: still to do).
NO_CASE_YET = {
    "authentication-reject", "security-mode-reject", "pdu-initial-context-setup", "pdu-returned", "pdu-setup-failed",
    "pdu-context-released", "pdu-accept-without-n2", "modification-complete", "modification-reject",
    "modification-command-reject", "release-reject", "handover-command", "handover-preparation-failure",
    "handover-failure", "path-switch-failure", "restarted",
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("verdictsd")
    allowed = ", ".join(f'"{d}"' for d in [*FOLDERS, root])
    env = make_env(root, f"[daemon]\nallowed_dirs = [{allowed}]\n")
    started = start_daemon(env)
    yield started
    started.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


async def views(daemon: DaemonProcess, path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    return (await call(daemon, "ngap_ue_sessions", pcap_path=str(path)),
            await call(daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures"),
            await call(daemon, "ngap_pdu_session_summary", pcap_path=str(path)))


def instances(procs: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for u in procs["ues"] for p in u["procedures"]]


def check_one_model(contexts: dict[str, Any], procs: dict[str, Any], sessions: dict[str, Any]) -> None:
    every = instances(procs)
    for p in every:  # every outcome names its rule, and the rule decides the outcome
        rule = RULES[p["rule_id"]]
        assert p["rule"] == rule.text and p["outcome"] == rule.outcome, p
        assert rule.procedure in (p["procedure"], "*"), p
    # The contexts view shows the same instances with the same outcome and rule.
    got = sorted((u["ue"], o["procedure"], o.get("pdu_session_id"), o["first_frame"], o["outcome"], o["rule"])
                 for u in contexts["ues"] for o in u["outcomes"])
    assert got == sorted((p["ue"], p["procedure"], p.get("pdu_session_id"), p["first_frame"], p["outcome"],
                          p["rule"]) for p in every)
    # The session summary: each establishment the same outcome, rule and cause; its status follows the rule.
    est = {(p["ue"], p["pdu_session_id"], p["first_frame"]): p for p in every
           if p["procedure"] == "PDU Session Establishment"}
    with_request = [s for s in sessions["sessions"] if s["establishment_request_frame"] is not None]
    assert len(with_request) == len(est)
    for s in with_request:
        p = est[(s["ue"], s["pdu_session_id"], s["establishment_request_frame"])]
        assert (s["outcome"], s["rule"], s["cause"]) == (p["outcome"], p["rule"], p["cause"]), (s, p)
        assert s["status"] in (STATUS_BY_RULE[p["rule_id"]], "no_setup_response")
    assert sessions["established_count"] == sum(1 for p in est.values() if p["outcome"] == "success")
    assert procs["statistics"].get("PDU Session Establishment", {}).get("success", 0) == sessions["established_count"]
    for u in contexts["ues"]:  # the registration state is the model's last registration outcome
        regs = [o["outcome"] for o in u["outcomes"] if o["procedure"] == "Registration"]
        if regs and u["registration"] != "deregistered":
            assert u["registration"] == {"success": "accepted", "reject": "rejected"}.get(regs[-1], "pending")


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
async def test_every_view_gives_each_instance_one_outcome_and_rule(daemon: DaemonProcess, path: Path) -> None:
    if ngap_frame_count(path) == 0:
        pytest.skip("no NGAP over SCTP in this capture")
    check_one_model(*await views(daemon, path))


def test_every_rule_row_is_shown_or_listed() -> None:
    assert set(IN_CORPUS) | BUILT | NO_CASE_YET == set(RULES)
    assert not (set(IN_CORPUS) & NO_CASE_YET) and not (BUILT & NO_CASE_YET)


@pytest.mark.parametrize("rule_id", sorted(IN_CORPUS))
async def test_rule_on_a_real_capture(daemon: DaemonProcess, rule_id: str) -> None:
    name, first = IN_CORPUS[rule_id]
    path = PCAPS.parent / name
    if not path.exists():
        pytest.skip(f"{name} is not in the shared corpus")
    procs = await call(daemon, "ngap_ue_sessions", pcap_path=str(path), view="procedures")
    decided = [p for p in instances(procs) if p["rule_id"] == rule_id]
    assert decided, f"{rule_id}: no instance in {name}"
    if first is not None:
        assert first in [p["first_frame"] for p in decided]


def built(daemon: DaemonProcess, source: Path, name: str, frame: int, at: int, old: int, new: int,
          drop: tuple[int, ...] = ()) -> Path:
    """`source` with byte `at` of frame `frame` changed from `old` to `new`, and frames `drop` removed."""
    data = bytearray(source.read_bytes())
    packet = list(packets(data))[frame - 1]
    assert data[packet.offset + at] == old
    data[packet.offset + at] = new
    edited = Path(daemon.env.root) / f"edited_{name}"
    edited.write_bytes(bytes(data))
    out = Path(daemon.env.root) / name
    subprocess.run(["editcap", str(edited), str(out), *map(str, drop)], check=True, capture_output=True)
    return out


async def test_switch_off_deregistration_completes_without_an_accept(daemon: DaemonProcess) -> None:
    source = EXTRA / "oaifed_5gcn-basic-deployment-nrf.pcap"
    if not source.exists():
        pytest.skip("pcaps-extra is not there")
    # Frame 721's DEREGISTRATION REQUEST (plain NAS inside an integrity-protected one): its type octet
    # 0x21 (normal) becomes 0x29 (switch off); the DEREGISTRATION ACCEPT (frame 722) is dropped.
    path = built(daemon, source, "switch_off.pcapng", 721, 0x60, 0x21, 0x29, drop=(722,))
    assert subprocess.run(["tshark", "-r", str(path), "-Y", "nas_5gs.mm.switch_off == 1", "-T", "fields", "-e",
                           "frame.number"], capture_output=True, text=True, check=True).stdout.split() == ["721"]
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    [dereg] = [p for p in instances(procs) if p["procedure"] == "Deregistration"]
    assert (dereg["outcome"], dereg["rule_id"], dereg["last_frame"]) == ("success", "deregistration-switch-off", 721)
    assert dereg["rule"] == "TS 24.501 5.5.2.2.1: no accept after switch-off"
    assert procs["incomplete"] == 0


async def test_authentication_reject_ends_the_registration(daemon: DaemonProcess) -> None:
    source = PCAPS / "adrian_registration_reject.pcap"
    if not source.exists():
        pytest.skip("the corpus is not there")
    # Frame 19's plain REGISTRATION REJECT (7e 00 44 07) becomes an AUTHENTICATION REJECT (7e 00 58 ..).
    path = built(daemon, source, "auth_reject.pcap", 19, 0x58, 0x44, 0x58)
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    [reg] = [p for p in instances(procs) if p["procedure"] == "Registration" and p["ue"].endswith("/ran-2")]
    assert (reg["outcome"], reg["rule_id"], reg["last_frame"]) == ("reject", "registration-auth-reject", 19)
    assert procs["statistics"]["Registration"]["reject"] == 1
    [ue] = [u for u in contexts["ues"] if u["ue"] == reg["ue"]]
    assert ue["registration"] == "rejected"
    assert not [f for f in ue["failures"] if "never accepted or rejected" in (f.get("why") or "")]
