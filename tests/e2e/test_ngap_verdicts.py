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
from tests.actors.pcap.test_ngap_fields import ue_keys
from tests.actors.pcap.test_ngap_procedures_model import check
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_ngap_summaries import call, ngap_frame_count
from tests.e2e.test_pcap import make_env
from tests.pcaps import PCAPS
from tests.support import built_captures, built_captures_n2, pcap_oracle, procedures_oracle
from tests.support.pcapedit import packets, transplant

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]
EXTRA = PCAPS.parent / "pcaps-extra"
FOLDERS = [d for d in (PCAPS, EXTRA) if d.is_dir()]
CAPTURES = sorted(p for d in FOLDERS for p in d.glob("*.pcap*"))

# Rule row -> a corpus capture that has the case (and the instance's first frame).
IN_CORPUS = {
    # Every REGISTRATION ACCEPT of the corpus gives a new 5G-GUTI: the UE's REGISTRATION COMPLETE ends it.
    "registration-complete": ("pcaps/adrian_sandbox_n2.pcap", 9),
    "initial-context-setup-response": ("pcaps/adrian_sandbox_n2.pcap", 16),
    "pdu-resource-setup-response": ("pcaps/adrian_sandbox_n2.pcap", 22),
    # The tester's Service Request (frame 35): frame 43's InitialContextSetupRequest sets PDU session 1 up again.
    "reactivation-setup": ("pcaps-extra/ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap", 43),
    "ng-reset-acknowledge": ("pcaps-extra/ngtester_open5gs_T04_ng_reset_amf_ngap_nas_sbi.pcap", 16),
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
    # The tester's PAGING (frame 28) is answered by the REGISTRATION REQUEST presenting its 5G-S-TMSI (frame 31).
    "paging-answered": ("pcaps-extra/ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap", 28),
}
SANDBOX, HO = "pcaps/adrian_sandbox_n2.pcap", "pcaps-extra/ngtester_open5gs_ho_window_p21_p09_amf_ngap_nas_sbi.pcap"
OAI = "pcaps-extra/oaifed_5gcn-basic-deployment-nrf.pcap"
# Rule row -> a capture built from real frames by byte flips: (capture, [(frame, bytes in it, replaced by)],
# frames dropped, the procedure and UE context label suffix the rule must decide). The bytes are searched in
# the frame and must occur once: NGAP PDU type + procedure code after the SCTP PPID 60 (0000003c), or a NAS
# message's header.
ACCEPT_WITHOUT_N2 = built_captures.RECIPES["pdu-accept-without-n2"]
FLIPPED: dict[str, tuple[str, list[tuple[int, str, str]], tuple[str, ...], str, str]] = {
    # The SECURITY MODE COMPLETE of UE 1 (frame 15) becomes a SECURITY MODE REJECT.
    "security-mode-reject": (SANDBOX, [(15, "7e005e77", "7e005f77")], (), "Security Mode", "ran-1"),
    # UE 1's AUTHENTICATION RESPONSE (frame 11) is dropped and its SECURITY MODE COMMAND becomes an
    # AUTHENTICATION REJECT: it ends the authentication (and the registration).
    "authentication-reject": (SANDBOX, [(12, "7e005d02", "7e005802")], ("11",), "Authentication", "ran-1"),
    # UE 3's accept rides in a DownlinkNASTransport, its setup response dropped (the recipe the in-process test uses).
    "pdu-accept-without-n2": (SANDBOX, list(ACCEPT_WITHOUT_N2.flips), ACCEPT_WITHOUT_N2.drop,
                              "PDU Session Establishment", "ran-3"),
    "handover-failure": (HO, [(13, "0000003c200d", "0000003c400d")], (), "Handover Resource Allocation", ""),
    "path-switch-failure": ("pcaps-extra/ngtester_chain_free5gc_pathswitch_then_release_amf_ngap_nas_sbi.pcap",
                            [(30, "0000003c2019", "0000003c4019")], (), "Path Switch", ""),
    # OAI's PDU SESSION RELEASE COMMAND (cause #26) becomes a RELEASE REJECT; the COMPLETE then answers nothing.
    "release-reject": (OAI, [(698, "2e0102d3", "2e0102d2")], (), "PDU Session Release", "ran-1"),
    # The same release exchange as a modification: request / command / complete, reject, command reject.
    "modification-complete": (OAI, [(684, "2e0102d1", "2e0102c9"), (698, "2e0102d3", "2e0102cb"),
                                    (699, "2e0102d4", "2e0102cc")], (), "PDU Session Modification", "ran-1"),
    "modification-reject": (OAI, [(684, "2e0102d1", "2e0102c9"), (698, "2e0102d3", "2e0102ca")], (),
                            "PDU Session Modification", "ran-1"),
    "modification-command-reject": (OAI, [(698, "2e0102d3", "2e0102cb"), (699, "2e0102d4", "2e0102cd")], (),
                                    "PDU Session Modification", "ran-1"),
}
# Rows neither corpus has a case of, shown on a capture built from real frames whose expected verdict is read
# with tshark from the built capture (test_rule_on_a_capture_built_from_real_frames_as_tshark_reads_it).
FROM_FRAMES = ("pdu-initial-context-setup", "pdu-returned", "pdu-setup-failed", "handover-command",
               "handover-preparation-failure")
# Rows shown on a capture built from real frames by their own test below.
# Rows shown on the N2 captures of tests/support/built_captures_n2.py (issue 42), each checked against
# procedures_oracle's reading of the built capture.
N2_BUILT = {rule for rules in built_captures_n2.SHOWS.values() for rule in rules}
BUILT = {"deregistration-switch-off", "registration-auth-reject", "pdu-context-released", "restarted", *FLIPPED,
         *FROM_FRAMES, *N2_BUILT}


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
    """Each UE context's instances, then the non-UE-associated ones (NG Reset)."""
    return [*(p for u in procs["ues"] for p in u["procedures"]), *procs["non_ue_procedures"]]


def check_one_model(contexts: dict[str, Any], procs: dict[str, Any], sessions: dict[str, Any]) -> None:
    every = instances(procs)
    for p in every:  # every outcome names its rule, and the rule decides the outcome
        rule = RULES[p["rule_id"]]
        assert p["rule"] == rule.text and p["outcome"] == rule.outcome, p
        assert rule.procedure in (p["procedure"], "*"), p
    # The contexts view shows the same instances of UE contexts with the same outcome and rule.
    got = sorted((u["ue"], o["procedure"], o.get("pdu_session_id"), o["first_frame"], o["outcome"], o["rule"])
                 for u in contexts["ues"] for o in u["outcomes"])
    assert got == sorted((p["ue"], p["procedure"], p.get("pdu_session_id"), p["first_frame"], p["outcome"],
                          p["rule"]) for p in every if p["ue"] is not None)
    # failed / statistics: every instance of the model, UE-associated or not.
    assert sorted((p["procedure"], p["first_frame"]) for p in procs["failed"]) == sorted(
        (p["procedure"], p["first_frame"]) for p in every if p["outcome"] in ("reject", "failure"))
    assert sum(row["count"] for row in procs["statistics"].values()) == len(every) == procs["procedure_count"]
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
    # Re-activations: each under its session, with the model's outcome and rule; none is an incomplete establishment.
    again = {(p["ue"], p["pdu_session_id"], p["first_frame"]): p for p in every
             if p["procedure"] == "PDU Session Re-activation"}
    listed = {(s["ue"], s["pdu_session_id"], r["setup_request_frame"]): r for s in sessions["sessions"]
              for r in s["reactivations"]}
    assert sorted(listed) == sorted(again) and sessions["reactivation_count"] == len(again)
    for key, r in listed.items():
        assert (r["outcome"], r["rule_id"], r["last_frame"]) == (again[key]["outcome"], again[key]["rule_id"],
                                                                   again[key]["last_frame"]), key
    assert not [s for s in sessions["incomplete"] if s["status"].startswith("reactivated")]
    assert procs["statistics"].get("PDU Session Establishment", {}).get("success", 0) == sessions["established_count"]
    for u in contexts["ues"]:  # the registration state is the model's last registration outcome
        regs = [o["outcome"] for o in u["outcomes"] if o["procedure"] == "Registration"]
        if regs and u["registration"] != "deregistered":
            assert u["registration"] == {"success": "accepted", "reject": "rejected", "failure": "failed"}.get(
                regs[-1], "pending")


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
async def test_every_view_gives_each_instance_one_outcome_and_rule(daemon: DaemonProcess, path: Path) -> None:
    contexts, procs, sessions = await views(daemon, path)
    if ngap_frame_count(path) == 0:  # tshark sees no NGAP: every view must be empty, none may invent one
        assert contexts["ues"] == [] and procs["ues"] == [] and sessions["sessions"] == [], path
        return
    check_one_model(contexts, procs, sessions)


def test_every_rule_row_has_a_case() -> None:
    """Each row of the table is shown on a real capture or on one built from real frames: no row without a case."""
    assert set(RULES) - set(IN_CORPUS) - BUILT == set(), "rule rows with no test case"
    assert (set(IN_CORPUS) | BUILT) - set(RULES) == set(), "cases for rows the table does not have"


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


def tshark_out(argv: list[str]) -> str:
    """What tshark prints for the capture after -r (this process's environment), kept on disk by its bytes,
    the tshark version, the argv and the Wireshark configuration (tests/support/pcap_oracle.cached_text)."""
    def run() -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return pcap_oracle.cached_text(Path(argv[argv.index("-r") + 1]), [*argv, pcap_oracle.config_key()], run)


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
    path = from_recipe(daemon, "deregistration-switch-off")  # frame 721 made a switch-off, 722 dropped
    assert tshark_out(["tshark", "-r", str(path), "-Y", "nas_5gs.mm.switch_off == 1", "-T", "fields", "-e",
                       "frame.number"]).split() == ["721"]
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


def frame_time(path: Path, frame: int) -> float:
    out = tshark_out(["tshark", "-r", str(path), "-Y", f"frame.number == {frame}", "-T", "fields", "-e",
                      "frame.time_epoch"])
    return float(out)


def spliced(daemon: DaemonProcess, source: Path, name: str, drop: tuple[int | str, ...],
            grafts: list[tuple[int, Path, int, int, dict[int, tuple[int, int]] | bytes]]) -> Path:
    """`source` without frames `drop`, then each graft appended: (sent as frame `like` of the source,
    donor capture, donor frame, TSN, payload patches or a whole new payload), 1 ms apart after the
    source's last frame."""
    root = Path(daemon.env.root)
    kept = root / f"kept_{name}"
    subprocess.run(["editcap", "-F", "pcap", str(source), str(kept), *map(str, drop)], check=True, capture_output=True)
    data = bytearray(kept.read_bytes())
    last = frame_time(kept, len(list(packets(data))))
    for step, (like, donor, frame, tsn, patches) in enumerate(grafts, start=1):
        transplant(data, like, bytearray(donor.read_bytes()), frame, tsn=tsn, time=last + step / 1000,
                   **({"payload": patches} if isinstance(patches, bytes) else {"patches": patches}))
    out = root / name
    out.write_bytes(bytes(data))
    return out


async def test_accept_in_n2_setup_then_5gmm_status_then_release_fails_in_every_view(daemon: DaemonProcess) -> None:
    """Issue 22 item 1: the accept rode in a PDUSessionResourceSetupRequest, the UE answered 5GMM STATUS #101,
    the context was released, no setup response ever came: failed, by rule pdu-5gmm-status, in every view."""
    source, slice_, auth = (PCAPS / n for n in ("adrian_sandbox_n2.pcap", "adrian_pdu_session_reject_slice.pcap",
                                               "adrian_auth_failure.pcap"))
    if not all(p.exists() for p in (source, slice_, auth)):
        pytest.skip("the corpus is not there")
    # UE 3 of the sandbox run (AMF/RAN UE NGAP ids 3/3): its accept rides in frame 41's
    # PDUSessionResourceSetupRequest; its setup response (frame 43, uplink TSN 21) is dropped. Appended on the
    # same association: the 5GMM STATUS of the slice-reject run (frame 37) sent uplink as an UplinkNASTransport
    # (procedure code 4 -> 46) with cause #91 -> #101, then the UEContextReleaseCommand / Complete of the
    # auth-failure run (frames 13 / 15), all with UE 3's ids. Every donor comes from the same lab (same addresses).
    path = from_recipe(daemon, "5gmm-status-then-release")  # the steps: built_captures.RECIPES
    rows = tshark_out(["tshark", "-r", str(path), "-o", "nas-5gs.null_decipher:TRUE", "-Y",
                       "ngap && frame.number > 41", "-T", "fields", "-e", "ngap.procedureCode", "-e",
                       "ngap.AMF_UE_NGAP_ID", "-e",
                       "ngap.RAN_UE_NGAP_ID", "-e", "nas_5gs.mm.5gmm_cause"]).splitlines()
    assert [r.split("\t") for r in rows] == [["46", "3", "3", "101"], ["41", "3", "3", ""], ["41", "3", "3", ""]]
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    [est] = [p for p in instances(procs) if p["procedure"] == "PDU Session Establishment" and p["ue"].endswith("ran-3")]
    assert (est["outcome"], est["rule_id"], est["last_frame"]) == ("failure", "pdu-5gmm-status", 44)
    assert est["cause"] == {"kind": "5GMM", "code": 101, "name": est["cause"]["name"]}
    [session] = [s for s in sessions["sessions"] if s["ue"] == est["ue"]]
    assert (session["status"], session["outcome"]) == ("failed", "failure")
    assert session["rule"] == RULES["pdu-5gmm-status"].text
    assert procs["statistics"]["PDU Session Establishment"]["success"] == 2 == sessions["established_count"]
    assert sessions["failed_count"] == 1
    diagram = await call(daemon, "pcap_sequence_diagram", pcap_path=str(path), ue=est["ue"], pdu_session_id=1)
    assert (diagram["outcome"], diagram["rule"]) == ("failure", RULES["pdu-5gmm-status"].text)


async def test_two_subscribers_presenting_one_5g_tmsi_stay_apart_and_the_answer_says_why(
        daemon: DaemonProcess) -> None:
    """Issue 22 item 4: two contexts present the same 5G-TMSI (never assigned here) and identify with different
    SUCIs: no link, and not_linked names the pair with its reason."""
    source, donor = PCAPS / "adrian_sandbox_n2.pcap", EXTRA / "ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap"
    if not (source.exists() and donor.exists()):
        pytest.skip("the corpora are not there")
    # The open5gs tester's REGISTRATION REQUEST presenting 5G-GUTI (5G-TMSI 0xc000061a, frame 31, AMF/RAN UE
    # NGAP ids 11/8) sent on the sandbox association by UE 2 and by UE 3, which registered with their own SUCIs.
    path = spliced(daemon, source, "one_tmsi_two_sucis.pcap", (), [
        (43, donor, 31, 22, {12: (0x0B, 0x02), 18: (0x08, 0x02)}),
        (43, donor, 31, 23, {12: (0x0B, 0x03), 18: (0x08, 0x03)}),
    ])
    out = tshark_out(["tshark", "-r", str(path), "-o", "nas-5gs.null_decipher:TRUE", "-Y",
                      "nas_5gs.5g_tmsi == 0xc000061a", "-T", "fields", "-e", "ngap.RAN_UE_NGAP_ID"]).split()
    assert out == ["2", "3"]
    contexts = await call(daemon, "ngap_ue_sessions", pcap_path=str(path))
    ue2, ue3 = (next(u for u in contexts["ues"] if u["ue"].endswith(f"/ran-{n}")) for n in (2, 3))
    assert ue2["suci_msin"] != ue3["suci_msin"]
    assert ue2["linked_group"] is None and ue3["linked_group"] is None
    [refused] = [r for r in contexts["not_linked"] if {r["ue"], r["not_linked_to"]} == {ue2["ue"], ue3["ue"]}]
    assert "3221227034" in refused["evidence"] and "different SUCIs" in refused["why"], refused
    assert "never assigned" in refused["why"]


def flipped(daemon: DaemonProcess, source: Path, name: str, edits: list[tuple[int, str, str]],
            drop: tuple[str, ...]) -> Path:
    """`source` with each (frame, old bytes, new bytes) replaced once inside that frame, frames `drop` removed."""
    data = bytearray(source.read_bytes())
    found = list(packets(data))
    for frame, old, new in edits:
        packet = found[frame - 1]
        body = bytes(data[packet.offset:packet.offset + packet.caplen])
        assert body.count(bytes.fromhex(old)) == 1, (frame, old)
        at = packet.offset + body.index(bytes.fromhex(old))
        data[at:at + len(new) // 2] = bytes.fromhex(new)
    edited = Path(daemon.env.root) / f"edited_{name}"
    edited.write_bytes(bytes(data))
    out = Path(daemon.env.root) / name
    subprocess.run(["editcap", str(edited), str(out), *drop], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("rule_id", sorted(FLIPPED))
async def test_rule_on_a_capture_built_by_byte_flips(daemon: DaemonProcess, rule_id: str) -> None:
    name, edits, drop, procedure, ue = FLIPPED[rule_id]
    source = PCAPS.parent / name
    if not source.exists():
        pytest.skip(f"{name} is not in the shared corpus")
    path = flipped(daemon, source, f"{rule_id}.pcap", edits, drop)
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    shows_the_row(procs, path, rule_id, procedure, ue)


def shows_the_row(procs: dict[str, Any], path: Path, rule_id: str, procedure: str, ue: str) -> None:
    """Every instance of the answer is the one tests/support/procedures_oracle.py reads from the built capture with
    tshark (same frames, outcome, cause, rule), and that independent reading decides `procedure` of the UE context
    labelled ...`ue` by `rule_id`: the row is shown because the capture shows it, not because rules.TABLE says so."""
    check(procs, path)
    labels = {key: label for label, key in ue_keys(procs).items()}
    shown = [(d.found[1], labels.get(d.found[0], "")) for d in procedures_oracle.details(path) if d.rule_id == rule_id]
    assert any(name == procedure and label.endswith(ue) for name, label in shown), (rule_id, shown)


@pytest.mark.parametrize("name", sorted(built_captures_n2.RECIPES))
async def test_n2_rules_on_captures_built_from_real_frames(daemon: DaemonProcess, name: str) -> None:
    """Issue 42: an accept lost with its InitialContextSetup, a REGISTRATION COMPLETE that never came, a release
    answered by an ERROR INDICATION, a failed re-activation, N2 resource modify / release: each through the daemon,
    against procedures_oracle's reading of the built capture."""
    source = built_captures_n2.built(name)
    if not source.exists():
        pytest.skip("the corpora are not there")
    path = Path(daemon.env.root) / f"n2_{name}.pcap"
    shutil.copyfile(source, path)
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    want = {d.rule_id for d in procedures_oracle.details(path)}
    assert set(built_captures_n2.SHOWS[name]) <= want, (name, want)
    check(procs, path)
    if name == "registration-accept-undelivered":  # issue 42 item 1, in every view
        [reg] = [p for p in instances(procs) if p["procedure"] == "Registration" and p["ue"].endswith("ran-2")]
        assert reg["cause"]["name"] == "radio-connection-with-ue-lost", reg
        assert reg in procs["failed"] and procs["statistics"]["Registration"]["failure"] == 1
        assert procs["statistics"]["Initial Context Setup"]["failure"] == 1
        [ue] = [u for u in contexts["ues"] if u["ue"] == reg["ue"]]
        assert ue["registration"] == "failed"
    if name == "service-accept-undelivered":  # the re-activation failed with its carrier: no incomplete establishment
        [s] = sessions["sessions"]
        assert (s["status"], s["outcome"], s["rule_id"]) == ("reactivation_failed", "failure", "reactivation-failed")
        assert sessions["incomplete"] == [] and sessions["reactivation_count"] == 1
    round_two(name, contexts, procs, sessions)


def round_two(name: str, contexts: dict[str, Any], procs: dict[str, Any], sessions: dict[str, Any]) -> None:
    """Issue 42 round 2, in every view: an accept a NAS NON DELIVERY INDICATION returned, a class-1 request an
    ERROR INDICATION ended, a PAGING nobody answered, a registration restarted after its accept."""
    if name == "registration-accept-non-delivery":  # UE 3's registration failed: the contexts view says so
        [reg] = [p for p in instances(procs) if p["procedure"] == "Registration" and p["ue"].endswith("ran-3")]
        assert (reg["rule_id"], reg["cause"]["name"]) == (name, "radio-connection-with-ue-lost"), reg
        [ue] = [u for u in contexts["ues"] if u["ue"] == reg["ue"]]
        assert ue["registration"] == "failed"
    if name == "service-accept-non-delivery":  # ended by its accept first, then decided again by the indication
        [sr] = [p for p in instances(procs) if p["procedure"] == "Service Request" and p["first_frame"] == 35]
        assert (sr["rule_id"], sr["last_frame"]) == (name, 44) and sr in procs["failed"]
    if name == "pdu-accept-non-delivery":
        [s] = [s for s in sessions["sessions"] if s["ue"].endswith("ran-3")]
        assert (s["status"], s["rule_id"]) == ("failed", name)
    if name == "n2-error-indication":
        [mod] = [p for p in instances(procs) if p["procedure"] == "PDU Session Resource Modify"]
        assert (mod["rule_id"], mod["last_frame"], mod["cause"]["name"]) == (name, 46, "unknown-local-UE-NGAP-ID")
        assert procs["statistics"]["PDU Session Resource Modify"]["failure"] == 1
    if name == "paging-no-response":  # not UE-associated, no answer: how long the capture went on
        [paging] = procs["non_ue_procedures"]
        assert (paging["procedure"], paging["rule_id"], paging["paged"]["5g_tmsi"]) == ("Paging", name, 0xC000061B)
        assert "answered_by" not in paging and "the capture's NGAP went on until frame 49 (" in paging["why"]
        assert all(u["pagings"] == [] for u in contexts["ues"])
    if name == "registration-restarted-after-accept":  # the why names the accept and the missing complete
        [reg, again] = [p for p in instances(procs) if p["procedure"] == "Registration" and p["ue"].endswith("ran-1")]
        assert (reg["rule_id"], again["rule_id"]) == ("restarted", "unanswered")
        assert reg["why"] == ("a new Registration started in frame 45, after its accept (frame 16) and before its "
                              "REGISTRATION COMPLETE: the accept gave a new 5G-GUTI (5G-TMSI 3221226468), never "
                              "acknowledged"), reg


async def test_a_paging_is_answered_by_the_ue_context_presenting_its_5g_s_tmsi(daemon: DaemonProcess) -> None:
    """TS 38.413 8.5.1: the tester's PAGING (frame 28, 5G-S-TMSI 1/0/0xc000061a) is answered by the REGISTRATION
    REQUEST presenting it (frame 31): under non_ue_procedures with the UE context and the evidence, and that
    context lists it under `pagings`."""
    path = EXTRA / "ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap"
    if not path.exists():
        pytest.skip("pcaps-extra is not there")
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    [paging] = procs["non_ue_procedures"]
    assert (paging["procedure"], paging["first_frame"], paging["last_frame"], paging["rule_id"]) == (
        "Paging", 28, 31, "paging-answered")
    assert paging["paged"] == {"amf_set_id": 1, "amf_pointer": 0, "5g_tmsi": 0xC000061A}
    by = paging["answered_by"]
    assert by["ue"].endswith("/amf-11/ran-8") and by["frame"] == 31 and "REGISTRATION REQUEST" in by["evidence"]
    [ue] = [u for u in contexts["ues"] if u["ue"] == by["ue"]]
    assert ue["pagings"] == [{"paging_frame": 28, "association": paging["association"], "answered_in_frame": 31,
                              "evidence": by["evidence"]}]
    assert procs["statistics"]["Paging"]["success"] == 1


async def test_context_release_before_the_n2_setup_response_fails_the_establishment(daemon: DaemonProcess) -> None:
    source, auth = PCAPS / "adrian_sandbox_n2.pcap", PCAPS / "adrian_auth_failure.pcap"
    if not (source.exists() and auth.exists()):
        pytest.skip("the corpus is not there")
    # UE 3's accept rides in frame 41's PDUSessionResourceSetupRequest; its setup response (frame 43) is dropped
    # and the auth-failure run's UEContextReleaseCommand / Complete are sent on the association as UE 3's.
    path = from_recipe(daemon, "released-before-n2-response")
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    [est] = [p for p in instances(procs) if p["procedure"] == "PDU Session Establishment" and p["ue"].endswith("ran-3")]
    assert (est["outcome"], est["rule_id"], est["last_frame"]) == ("failure", "pdu-context-released", 44)
    [session] = [s for s in sessions["sessions"] if s["ue"] == est["ue"]]
    assert (session["status"], session["outcome"]) == ("failed", "failure")


async def test_the_same_request_again_before_an_answer_restarts_the_procedure(daemon: DaemonProcess) -> None:
    source = PCAPS / "adrian_sandbox_n2.pcap"
    if not source.exists():
        pytest.skip("the corpus is not there")
    # The capture ends at UE 3's AUTHENTICATION REQUEST (frame 26), which is then sent a second time.
    path = from_recipe(daemon, "restarted")
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    auth = [p for p in instances(procs) if p["procedure"] == "Authentication" and p["ue"].endswith("ran-3")]
    assert [(p["first_frame"], p["rule_id"]) for p in auth] == [(26, "restarted"), (27, "unanswered")]
    assert "frame 27" in auth[0]["why"]



def frame_values(path: Path, field: str) -> dict[int, set[str]]:
    out = tshark_out(["tshark", "-r", str(path), "-o", "nas-5gs.null_decipher:TRUE", "-Y", f"sctp && {field}",
                      "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=|", "-e", "frame.number", "-e",
                      field])
    return {int(n): set(v.split("|")) for n, v in (line.split("\t") for line in out.splitlines())}


async def test_session_fields_come_from_whichever_ngap_pdu_of_the_frame_carries_them(daemon: DaemonProcess) -> None:
    """Issue 22 item 8: a DNN is read wherever the frame carries it for the session (e.g. the UL NAS TRANSPORT's
    own DNN IE around an establishment request in the 3rd NGAP PDU of a frame), on every corpus capture."""
    checked: list[tuple[str, str, int]] = []
    for path in CAPTURES:
        if ngap_frame_count(path) == 0:
            continue
        dnns = frame_values(path, "nas_5gs.cmn.dnn")
        sessions = (await call(daemon, "ngap_pdu_session_summary", pcap_path=str(path)))["sessions"]
        for s in sessions:
            frames = [s[k] for k in ("establishment_request_frame", "establishment_accept_frame") if s[k] is not None]
            seen: set[str] = set().union(*(dnns.get(f, set()) for f in frames))
            if len(seen) == 1:  # the frames name one DNN: the session has it
                assert s["dnn"] in seen, (path.name, s["ue"], s["pdu_session_id"], frames, seen, s["dnn"])
                checked.append((path.name, s["ue"], s["pdu_session_id"]))
    if PCAPS.is_dir():  # UE 2's request (frame 35, 3rd NGAP PDU) was answered by a 5GMM STATUS: no accept
        assert ("adrian_pdu_session_reject_slice.pcap", "A1/amf-2/ran-2", 2) in checked, checked


@pytest.mark.parametrize(("encoded", "plmn"), [("00f110", ("001", "01")), ("001100", ("001", "001"))])
async def test_plmn_identities_keep_their_digits(daemon: DaemonProcess, encoded: str, plmn: tuple[str, str]) -> None:
    """Issue 22 item 8: PLMN 001/01 prints as 001/01 (not 1/1); a 3-digit MNC keeps its three digits."""
    source = PCAPS / "adrian_sandbox_n2.pcap"
    if not source.exists():
        pytest.skip("the corpus is not there")
    # UE 1's SUCI (type 01, PLMN 999/70 = 99 f9 07 in frame 9's REGISTRATION REQUEST) gets another PLMN.
    path = flipped(daemon, source, f"plmn_{encoded}.pcap", [(9, "0199f907", "01" + encoded)], ())
    contexts = await call(daemon, "ngap_ue_sessions", pcap_path=str(path))
    [ue] = [u for u in contexts["ues"] if u["ue"].endswith("/ran-1")]
    assert ue["plmn"] == {"mcc": plmn[0], "mnc": plmn[1]}, ue["plmn"]


def from_recipe(daemon: DaemonProcess, name: str) -> Path:
    """The capture of tests/support/built_captures.py's recipe `name` (shared with the in-process procedures
    test), copied where the daemon may read it."""
    out = Path(daemon.env.root) / f"{name}.pcap"
    shutil.copyfile(built_captures.built(name), out)
    return out


def tshark_rows(path: Path, display: str, *fields: str) -> list[list[str]]:
    columns = [a for f in fields for a in ("-e", f)]
    out = tshark_out(["tshark", "-r", str(path), "-o", "nas-5gs.null_decipher:TRUE", "-Y", display, "-T",
                      "fields", "-E", "occurrence=a", "-E", "aggregator=,", *columns])
    return [line.split("\t") for line in out.splitlines()]


def malformed(path: Path) -> list[str]:
    """The NGAP messages (procedure code / which PDU type) tshark finds malformed, sorted."""
    rows = tshark_rows(path, "_ws.malformed", "ngap.procedureCode", "ngap.initiatingMessage_element",
                       "ngap.successfulOutcome_element")
    return sorted(f"{r[0]}/{0 if r[1] else 1 if r[2] else 2}" for r in rows)


def expected_verdict(path: Path) -> dict[str, Any]:
    """The decided instance of UE 1/1 (sandbox) or of the handover's context, read with tshark alone
    (TS 38.413 8.2.1 / 8.3.1 / 8.4.1, TS 24.501 5.4.5.2.5): the frame that ends it, how, with which cause."""
    handover = tshark_rows(path, "ngap.procedureCode == 12", "frame.number", "ngap.initiatingMessage_element",
                           "ngap.successfulOutcome_element", "ngap.AMF_UE_NGAP_ID", "ngap.RAN_UE_NGAP_ID",
                           "ngap.radioNetwork", "sctp.assoc_index", "ip.src", "ip.dst")
    if handover:
        [required] = [r for r in handover if r[1]]
        answers = [r for r in handover if not r[1] and r[3:5] == required[3:5]  # same ids, same association
                   and {r[7], r[8]} == {required[7], required[8]}]
        [answer] = answers
        if answer[2]:
            return {"procedure": "Handover Preparation", "first_frame": int(required[0]),
                    "last_frame": int(answer[0]), "rule_id": "handover-command", "cause": None}
        return {"procedure": "Handover Preparation", "first_frame": int(required[0]), "last_frame": int(answer[0]),
                "rule_id": "handover-preparation-failure", "cause": ("NGAP", "radioNetwork", int(answer[5]))}
    ue1 = "ngap.AMF_UE_NGAP_ID == 1 && ngap.RAN_UE_NGAP_ID == 1"  # frames of UE 1 carry no other UE's PDU
    [request] = [int(r[0]) for r in tshark_rows(path, f"{ue1} && nas_5gs.sm.message_type == 0xc1 && "
                                                      "ngap.procedureCode == 46", "frame.number")]
    est = {"procedure": "PDU Session Establishment", "first_frame": request}
    returned = tshark_rows(path, f"{ue1} && nas_5gs.mm.message_type == 0x68 && nas_5gs.mm.5gmm_cause", "frame.number",
                           "nas_5gs.mm.5gmm_cause", "nas_5gs.sm.message_type")
    if returned:
        [(frame, cause, inner)] = returned
        assert inner == "0xc1"  # it hands back the request
        return {**est, "last_frame": int(frame), "rule_id": "pdu-returned", "cause": ("5GMM", None, int(cause))}
    carried = tshark_rows(path, f"{ue1} && nas_5gs.sm.message_type == 0xc2", "frame.number", "ngap.procedureCode")
    [(accept, code)] = carried
    answers = tshark_rows(path, f"{ue1} && ngap.procedureCode == {code} && ngap.successfulOutcome_element && "
                                "ngap.id in {55, 58, 72, 75}",
                          "frame.number", "ngap.id", "ngap.transport")
    [(frame, ids, transport)] = [r for r in answers if int(r[0]) > int(accept)]
    if "58" in ids.split(","):  # PDUSessionResourceFailedToSetupListSURes
        return {**est, "last_frame": int(frame), "rule_id": "pdu-setup-failed", "cause": ("NGAP", "transport",
                                                                                          int(transport))}
    assert {"14": "72", "29": "75"}[code] in ids.split(",")  # the Cxt / SU setup response list
    return {**est, "last_frame": int(frame), "cause": None,
            "rule_id": {"14": "pdu-initial-context-setup", "29": "pdu-setup-response"}[code]}


@pytest.mark.parametrize("rule_id", FROM_FRAMES)
async def test_rule_on_a_capture_built_from_real_frames_as_tshark_reads_it(daemon: DaemonProcess,
                                                                         rule_id: str) -> None:
    if not ((PCAPS.parent / SANDBOX).exists() and (PCAPS.parent / HO).exists()):
        pytest.skip("the corpora are not there")
    path = from_recipe(daemon, rule_id)
    # The built frames dissect as the real ones do: none malformed that was not already (the tester's
    # HandoverRequired / Request / Acknowledge / Command carry one-byte placeholder transparent containers).
    source = malformed(PCAPS.parent / (HO if rule_id.startswith("handover") else SANDBOX))
    assert all(malformed(path).count(m) <= source.count(m) for m in malformed(path)), (malformed(path), source)
    want = expected_verdict(path)
    assert want["rule_id"] == rule_id  # the capture shows the case it was built for, as tshark reads it
    contexts, procs, sessions = await views(daemon, path)
    check_one_model(contexts, procs, sessions)
    decided = [p for p in instances(procs) if p["procedure"] == want["procedure"]]
    [got] = [p for p in decided if p["first_frame"] == want["first_frame"]]
    assert (got["last_frame"], got["rule_id"], got["outcome"]) == (want["last_frame"], rule_id,
                                                                    RULES[rule_id].outcome), got
    cause = got["cause"]
    if want["cause"] is None:
        assert cause is None, got
    else:
        kind, group, code = want["cause"]
        assert (cause["kind"], cause["code"]) == (kind, code), got
        if group is not None:
            assert cause["group"] == group, got
    # Nothing else came of it: the handed-back request is no new establishment, no instance is left open.
    assert [p for p in decided if p is not got and p["outcome"] == "incomplete"] == [], decided
