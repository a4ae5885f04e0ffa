"""Every field of the NGAP UE-context and PDU-session answers against tshark -T fields, on every corpus capture.

The NGAP model runs in-process on the real sharkd trees of each capture (fetched once, cached:
tests/support/sharkd_trees.py), fast enough for the mutation gate (scripts/mutation.sh); the same
comparison runs through the daemon in tests/e2e/test_ngap_summaries.py. The second answer is
tests/support/ngap_fields_oracle.py, which never imports diagd.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from diagd.actors.pcap import ngap
from tests.pcaps import PCAPS, corpus
from tests.support import ngap_fields_oracle, ngap_links_oracle, ngap_oracle
from tests.support.built_captures import RECIPES, built
from tests.support.built_captures_reuse import NAMES as REUSE_NAMES
from tests.support.built_captures_reuse import built_reuse
from tests.support.sharkd_trees import ngap_trees

# Real captures with frames taken out (editcap), for what the corpus never shows: a class-1 request whose
# answer is missing although the association goes on (a failure, for a UE context and for the association),
# and one the capture ends on (pending, not a failure). Written once beside the tree cache.
EDITS = {
    "no-ics-response": ("adrian_registration_reject.pcap", ["15"]),  # InitialContextSetupResponse deleted
    "ends-on-ics-request": ("adrian_registration_reject.pcap", ["-r", "1-14"]),
    "no-ng-setup-response": ("adrian_registration_reject.pcap", ["7"]),
    "ends-on-ng-setup-request": ("adrian_registration_reject.pcap", ["-r", "1-5"]),
}


def edited(name: str) -> Path:
    source, args = EDITS[name]
    out = ngap_oracle.CACHE / f"edited-{name}-{hashlib.sha256(repr(args).encode()).hexdigest()[:8]}.pcap"
    if not out.exists() and (PCAPS / source).exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["editcap", "-F", "pcap", str(PCAPS / source), str(tmp), *args], check=True,
                       capture_output=True)
        tmp.replace(out)  # a stable path and mtime: the sharkd trees and oracle answers stay cached
    return out


CAPTURES = corpus() + ([edited(name) for name in EDITS] if shutil.which("editcap") else [])
# Captures this oracle cannot read unambiguously, and why: it says so (raises) instead of guessing,
# and the test checks it still does, so an oracle that learns them has this list shortened.
CANNOT_TELL: dict[str, str] = {}
UE_FIELDS = ("frames", "5g_tmsi", "plmn", "suci_msin", "registration", "first_time", "last_time", "duration_s")
SESSION_FIELDS = ("dnn", "ue_ipv4", "s_nssai", "n3_uplink", "n3_downlink", "n3_uplink_additional",
                  "n3_downlink_additional", "qfis", "release", "first_frame",
                  "establishment_request_frame", "establishment_accept_frame", "accept_in_n2_setup",
                  "establishment_reject_frame", "returned_by_amf_frame", "setup_request_frame", "setup_response_frame",
                  "setup_result", "status")
TIMES = {"first_time", "last_time", "duration_s"}  # seconds, rounded to µs: float parsing may differ in the last
# The documented shape of each answer (docs/5g.md): exactly these keys, so a renamed or lost one fails.
UE_ANSWER_KEYS = {"ue_count", "ues", "failed_ues", "associations", "linked_ue_groups", "not_linked",
                  "non_ue_failures", "ngap_pdus", "warnings"}
UE_KEYS = {"ue", "association", "gnb", "amf", "ran_ue_ngap_id", "amf_ue_ngap_id", "suci_msin", "5g_tmsi", "plmn",
           "first_time", "last_time", "duration_s", "frames", "procedures", "nas_messages", "failures",
           "pending_requests", "registration", "outcomes", "ended", "linked_group", "pagings"}
FAILED_UE_KEYS = {"ue", "association", "amf_ue_ngap_id", "ran_ue_ngap_id", "reasons"}
ASSOCIATION_KEYS = {"association", "endpoints", "sctp_assoc_index", "gnb", "amf", "first_frame", "ngap_pdus",
                    "ue_contexts", "procedures", "pending_requests"}
PENDING_KEYS = {"frame", "kind", "group", "code", "cause", "procedure", "why"}
SESSION_ANSWER_KEYS = {"session_count", "established_count", "rejected_count", "failed_count", "sessions", "rejected",
                       "incomplete", "warnings", "reactivation_count"}
SESSION_KEYS = {"ue", "association", "ran_ue_ngap_id", "amf_ue_ngap_id", "pdu_session_id", "establishment",
                "first_frame", "establishment_request_frame", "dnn", "s_nssai", "establishment_accept_frame",
                "accept_in_n2_setup", "ue_ipv4", "establishment_reject_frame", "setup_request_frame",
                "setup_response_frame", "setup_result", "n3_uplink", "n3_downlink", "qfis", "failures",
                "returned_by_amf_frame", "release", "status", "outcome", "rule", "cause", "reactivations"}
# rule_id with a rule; why with an incomplete outcome; additional N3 tunnels when the N2 setup lists some
SESSION_OPTIONAL_KEYS = {"hint", "why", "rule_id", "n3_uplink_additional", "n3_downlink_additional"}
TUNNEL_FIELDS = ("n3_uplink", "n3_downlink", "n3_uplink_additional", "n3_downlink_additional")


def ue_keys(result: dict[str, Any]) -> dict[str, ngap_oracle.UeKey]:
    """{UE label: (endpoint, endpoint, association index, AMF id, RAN id, n)} of an ngap_ue_sessions answer: n is
    the label's `#n` (the n-th context of that association and id pair), 1 without one."""
    assoc = {a["association"]: (a["endpoints"][0], a["endpoints"][1], a["sctp_assoc_index"])
             for a in result["associations"]}
    return {u["ue"]: (*assoc[u["association"]], u["amf_ue_ngap_id"], u["ran_ue_ngap_id"],
                      int(u["ue"].partition("#")[2] or 1)) for u in result["ues"]}


def octets(value: Any) -> Any:
    """Byte strings as tshark -T fields prints them (hex, no separators); other values unchanged."""
    if isinstance(value, str) and all(c in "0123456789abcdef:" for c in value):
        return value.replace(":", "")
    if isinstance(value, dict):
        return {k: v if k in ("address", "ipv6") else octets(v) for k, v in value.items()}  # IPv6 has colons too
    if isinstance(value, list):
        return [octets(v) for v in value]
    return value


def compare_fields(ues: dict[str, Any], sessions: dict[str, Any], want: ngap_fields_oracle.Fields) -> int:
    """Assert every UE and session field equals the oracle's; returns how many values were compared."""
    keys = ue_keys(ues)
    assert sorted(keys.values(), key=repr) == sorted(want.ues, key=repr)
    compared = 0
    for ue in ues["ues"]:
        expected = want.ues[keys[ue["ue"]]]
        for name in UE_FIELDS:
            want_value = pytest.approx(expected[name], abs=2e-6) if name in TIMES else expected[name]
            assert (ue["ue"], name, ue[name]) == (ue["ue"], name, want_value)
            compared += 1
        nas = sorted((m["frame"], m["layer"], int(m["code"], 16), m["message"]) for m in ue["nas_messages"])
        assert (ue["ue"], nas) == (ue["ue"], expected["nas_messages"])
    got = {(keys[s["ue"]], s["pdu_session_id"], s["establishment"]): s for s in sessions["sessions"]}
    assert sorted(got, key=repr) == sorted(want.sessions, key=repr)
    for key, s in got.items():
        expected_session = want.sessions[key]
        for name in SESSION_FIELDS:
            value = octets(s.get(name)) if name in ("s_nssai", *TUNNEL_FIELDS) else s.get(name)
            assert (s["ue"], s["pdu_session_id"], name, value) == \
                (s["ue"], s["pdu_session_id"], name, getattr(expected_session, name))
            compared += 1
        failures = [(f["frame"], f["kind"], f["code"], f["cause"]) for f in s["failures"]]
        assert (s["ue"], s["pdu_session_id"], failures) == (s["ue"], s["pdu_session_id"], expected_session.failures)
    return compared


def failure_rows(failures: list[dict[str, Any]]) -> list[ngap_oracle.Failure]:
    """diagd's failure entries as the oracle's tuples (frame, kind, code, cause name, why, by)."""
    rows = (ngap_oracle.Failure(f["frame"], f["kind"], f["code"], f["cause"], f["why"],
                                f.get("message") or f.get("procedure") or "") for f in failures)
    return sorted(rows, key=ngap_oracle.in_order)


def compare_answer(ues: dict[str, Any], sessions: dict[str, Any], want: ngap_oracle.Answer) -> None:
    """Contexts, failures (with cause names and reasons), pending requests, SUCI links and session
    outcomes against tests/support/ngap_oracle.py: what the daemon answers or the model returns in-process."""
    keys = ue_keys(ues)
    assoc_keys = {a["association"]: (a["endpoints"][0], a["endpoints"][1], a["sctp_assoc_index"])
                  for a in ues["associations"]}
    assert ues["ngap_pdus"] == want.ngap_pdus
    assert set(assoc_keys.values()) == want.associations
    # One UE context per (association, AMF id, RAN id), however many gNBs reuse the numbers; a pair reused in one
    # association is the n-th context of that pair.
    assert ues["ue_count"] == len(ues["ues"]) == len(want.ues) == len({(k[:3], k[3], k[5]) for k in want.ues})
    assert sorted(keys.values(), key=repr) == sorted(want.ues, key=repr)
    # Each failure under the UE whose ids its PDU carries, only real failures, with its cause name and reason.
    assert {keys[u["ue"]]: failure_rows(u["failures"]) for u in ues["ues"]} == want.failures
    assert [[f["frame"] for f in u["failures"]] for u in ues["ues"]] == \
        [sorted(f["frame"] for f in u["failures"]) for u in ues["ues"]]  # in capture order
    assert ues["failed_ues"] == [
        {"ue": u["ue"], "association": u["association"], "amf_ue_ngap_id": u["amf_ue_ngap_id"],
         "ran_ue_ngap_id": u["ran_ue_ngap_id"], "reasons": [{k: f.get(k) for k in ("frame", "kind", "code", "cause",
                                                                                    "why")} for f in u["failures"]]}
        for u in ues["ues"] if want.failures[keys[u["ue"]]]]
    non_ue: dict[ngap_oracle.Assoc, list[dict[str, Any]]] = {}
    for f in ues["non_ue_failures"]:
        non_ue.setdefault(assoc_keys[f["association"]], []).append(f)
    assert {a: failure_rows(f) for a, f in non_ue.items()} == want.non_ue_failures
    # Requests still open when the capture ends: under their context (or association), not failures.
    open_: list[tuple[ngap_oracle.UeKey | None, ngap_oracle.Assoc, int, str]] = [
        (keys[u["ue"]], assoc_keys[u["association"]], p["frame"], p["procedure"])
        for u in ues["ues"] for p in u["pending_requests"]]
    open_ += [(None, assoc_keys[a["association"]], p["frame"], p["procedure"])
              for a in ues["associations"] for p in a["pending_requests"]]
    assert sorted(open_, key=repr) == sorted(want.open_requests, key=repr)
    assert all(p["why"] == "capture ends before any response could be seen" and p["kind"] == "NGAP"
               and p["group"] is p["code"] is p["cause"] is None
               for x in [*ues["ues"], *ues["associations"]] for p in x["pending_requests"])
    assert {a["association"]: a["ue_contexts"] for a in ues["associations"]} == \
        {label: sum(1 for k in want.ues if k[:3] == assoc) for label, assoc in assoc_keys.items()}
    compare_suci_groups(ues, keys, want)

    s_keys = {s["ue"]: keys[s["ue"]] for s in sessions["sessions"]}
    established = {(s_keys[s["ue"]], s["pdu_session_id"], s["establishment_accept_frame"])
                   for s in sessions["sessions"] if s["status"] == "established"}
    assert sessions["established_count"] == len(established) == len(want.established) == want.accepts_in_n2_setup
    assert established == want.established
    rejected = {(s_keys[s["ue"]], s["pdu_session_id"],
                 s["establishment_reject_frame"] or s["returned_by_amf_frame"] or s["setup_response_frame"])
                for s in sessions["rejected"]}
    assert rejected == want.rejected and len(sessions["rejected"]) == sessions["rejected_count"]
    assert sessions["rejected"] == [s for s in sessions["sessions"] if s["status"] in ("rejected", "setup_failed")]
    assert sessions["incomplete"] == [{"ue": s["ue"], "pdu_session_id": s["pdu_session_id"], "status": s["status"]}
                                      for s in sessions["sessions"]
                                      if s["status"] not in ("established", "rejected", "setup_failed", "failed",
                                                             "reactivated", "reactivation_failed")]
    assert sessions["failed_count"] == sum(1 for s in sessions["sessions"] if s["status"] == "failed")
    assert sessions["session_count"] == len(sessions["sessions"])
    order = [(s["first_frame"], s["ue"], s["pdu_session_id"]) for s in sessions["sessions"]]
    assert order == sorted(order)
    for s in sessions["sessions"]:
        assert s.get("hint") == hint(s, want.failures[s_keys[s["ue"]]])
        if s["setup_response_frame"] is not None:
            assert s["setup_request_frame"] is not None and s["setup_response_frame"] > s["setup_request_frame"], s
        if s["establishment_accept_frame"] is not None and s["establishment_request_frame"] is not None:
            assert s["establishment_accept_frame"] > s["establishment_request_frame"], s


def compare_suci_groups(ues: dict[str, Any], keys: dict[str, ngap_oracle.UeKey], want: ngap_oracle.Answer) -> None:
    """The same-SUCI links of linked_ue_groups make the oracle's SUCI groups (5G-TMSI and handover links are not
    the oracle's); groups are numbered from 1 and each member context names its group."""
    suci: list[set[ngap_oracle.UeKey]] = []
    for e in (e for g in ues["linked_ue_groups"] for e in g["evidence"] if e["evidence"] == "same SUCI"):
        assert e["frames"], e
        pair = {keys[e["ue"]], keys[e["linked_to"]]}
        joined = [g for g in suci if g & pair]
        suci = [g for g in suci if not g & pair] + [pair.union(*joined)]
    assert sorted(map(sorted, suci)) == sorted(map(sorted, want.suci_groups))
    numbers = {label: g["group"] for g in ues["linked_ue_groups"] for label in g["ues"]}
    assert {u["ue"]: u["linked_group"] for u in ues["ues"]} == {u["ue"]: numbers.get(u["ue"]) for u in ues["ues"]}
    assert [g["group"] for g in ues["linked_ue_groups"]] == list(range(1, len(ues["linked_ue_groups"]) + 1))
    for g in ues["linked_ue_groups"]:
        assert {e["ue"] for e in g["evidence"]} | {e["linked_to"] for e in g["evidence"]} == set(g["ues"])


def hint(s: dict[str, Any], failures: list[ngap_oracle.Failure]) -> str | None:
    """docs/5g.md: a session with no answer names what its UE context reported next (a PDU's own failure)."""
    if s["status"] != "no_answer":
        return None
    own = [f for f in failures if not f.why.startswith(("no response to ", "registration request never"))]
    later = [f for f in own if f.frame > s["establishment_request_frame"]]
    if not later:
        return None
    f = later[0]
    return f"the UE context reported {f.by} (cause {f.code}: {f.cause}) in frame {f.frame} after this request"


def assert_shape(ues: dict[str, Any], sessions: dict[str, Any], served: bool = False) -> None:
    """Exactly the documented keys in every part of both answers (served: plus the daemon's `source`, `cached`
    and the page of the lists: `offset`, `has_more`, `totals`)."""
    envelope = {"reason", *(("source", "cached", "offset", "has_more", "totals") if served else ())}
    assert set(ues) - envelope == UE_ANSWER_KEYS and ("reason" in ues) == (not ues["ues"])
    assert set(sessions) - envelope == SESSION_ANSWER_KEYS and ("reason" in sessions) == (not sessions["sessions"])
    for ue in ues["ues"]:
        assert set(ue) - {"amf_ue_ngap_ids"} == UE_KEYS
        assert ("amf_ue_ngap_ids" in ue) == (len(ue.get("amf_ue_ngap_ids", [])) > 1), ue["ue"]
        assert all(set(p) == PENDING_KEYS for p in ue["pending_requests"])
        assert all({"frame", "layer", "code", "message"} == set(m) for m in ue["nas_messages"])
    assert all(set(f) == FAILED_UE_KEYS for f in ues["failed_ues"])
    for a in ues["associations"]:
        assert set(a) - {"ran_node_name", "global_ran_node_id"} >= ASSOCIATION_KEYS
        assert all(set(p) == PENDING_KEYS for p in a["pending_requests"])
    assert all(f["association"] in {a["association"] for a in ues["associations"]} for f in ues["non_ue_failures"])
    for g in ues["linked_ue_groups"]:
        assert set(g) == {"group", "ues", "evidence"}
        assert all(set(e) == {"ue", "linked_to", "evidence", "frames"} for e in g["evidence"])
    assert all(set(r) == {"ue", "not_linked_to", "evidence", "frames", "why"} for r in ues["not_linked"])
    for s in sessions["sessions"]:
        assert set(s) - SESSION_OPTIONAL_KEYS == SESSION_KEYS and ("rule_id" in s) == (s["rule"] is not None)
        assert all({"frame", "kind", "code", "cause"} <= set(f) for f in s["failures"])
        nas_failures = [f for f in s["failures"] if f["kind"] != "NGAP"]
        assert all(set(f) == {"frame", "kind", "code", "cause", "message"} for f in nas_failures)


def model(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    pdus = [pdu for number, answer in sorted(ngap_trees(path).items())
            for pdu in ngap.pdus_in_frame(number, answer["tree"])]
    built = ngap.build_model(pdus)
    return ngap.ue_sessions(built), ngap.pdu_sessions(built)


Oracle = TypeVar("Oracle")


def oracle_answer(path: Path, answer: Callable[[Path], Oracle], cannot_tell: dict[str, str]) -> Oracle | None:
    """The oracle's answer on `path`; None where the oracle must say it cannot tell (asserted with its
    reason); a skip when the corpus is absent (a failure under CI: tests/skip_policy.py)."""
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    if path.name in cannot_tell:
        with pytest.raises(ngap_oracle.OracleCannotTell, match=cannot_tell[path.name]):
            answer(path)
        return None
    return answer(path)


@pytest.mark.parametrize("path", CAPTURES or [PCAPS / "(no corpus)"], ids=lambda p: p.name)
def test_every_field_agrees_with_tshark_fields(path: Path) -> None:
    if (want := oracle_answer(path, ngap_fields_oracle.answer, CANNOT_TELL)) is None:
        return
    ues, sessions = model(path)
    compare_fields(ues, sessions, want)
    if not want.ues:
        assert ues["ue_count"] == 0 and sessions["session_count"] == 0


@pytest.mark.parametrize("path", CAPTURES or [PCAPS / "(no corpus)"], ids=lambda p: p.name)
def test_failures_and_outcomes_agree_with_tshark_fields(path: Path) -> None:
    """Failures (cause names, reasons), open requests, SUCI links and session outcomes, in-process."""
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    if path.name in CANNOT_TELL:
        with pytest.raises(ngap_oracle.OracleCannotTell, match=CANNOT_TELL[path.name]):
            ngap_oracle.answer(path)
        return
    ues, sessions = model(path)
    assert_shape(ues, sessions)
    compare_answer(ues, sessions, ngap_oracle.answer(path))


UNDECODED = ("security-protected NAS PDUs did not decode into a plain message (ciphered with a real algorithm, or "
             "null_decipher=false): their registrations, rejects and PDU sessions are invisible. To include them: "
             "null_decipher=true (the default) reads NAS under NEA0; NAS ciphered with NEA1/2/3 needs a capture "
             "taken with the AMF's ciphering set to NEA0")
HEADLESS = ("UE contexts have no InitialUEMessage in the capture (it started after them, or the display filter "
            "left it out)")


@pytest.mark.parametrize("path", (CAPTURES or [PCAPS / "(no corpus)"]) + [built(name) for name in RECIPES]
                         + [built_reuse(name) for name in REUSE_NAMES], ids=lambda p: p.name)
def test_associations_contexts_and_links_agree_with_tshark_fields(path: Path) -> None:
    """Association sides, labels, PDU lists and counts, how each context ended, the InitialUEMessage
    warning and the 5G-TMSI and handover links and refusals, in-process, against tests/support/ngap_links_oracle.py."""
    if (want := oracle_answer(path, ngap_links_oracle.answer, CANNOT_TELL)) is None:
        return
    ues, _ = model(path)
    got_assocs = {(a["endpoints"][0], a["endpoints"][1], a["sctp_assoc_index"]): {
        "label": a["association"], "first_frame": a["first_frame"], "ngap_pdus": a["ngap_pdus"], "amf": a["amf"],
        "gnb": a["gnb"], "procedures": [(p["frame"], p["procedure"], p["code"], p["type"]) for p in a["procedures"]]}
        for a in ues["associations"]}
    assert got_assocs == want.associations
    assert all(a["endpoints"] == sorted(a["endpoints"]) and len(a["endpoints"]) == 2 for a in ues["associations"])
    assert [a["association"] for a in ues["associations"]] == [f"A{n}" for n in range(1, len(want.associations) + 1)]
    keys = ue_keys(ues)
    got_ues = {keys[u["ue"]]: {"label": u["ue"], "ended": u["ended"], "procedures": [
        (p["frame"], p["procedure"], p["code"], p["type"]) for p in u["procedures"]],
        "amf_ids": u.get("amf_ue_ngap_ids") or [u["amf_ue_ngap_id"]] * (u["amf_ue_ngap_id"] is not None)}
        for u in ues["ues"]}
    assert got_ues == want.ues
    # the whole list (no capture here lacks an SCTP association index or has an NGAP PDU read in part)
    assert ues["warnings"] == ([f"{want.undecoded} {UNDECODED}"] if want.undecoded else []) + (
        [f"{want.headless} {HEADLESS}"] if want.headless else [])
    evidence = [(e["ue"], e["linked_to"], e["evidence"], tuple(e["frames"]))
                for g in ues["linked_ue_groups"] for e in g["evidence"]]
    assert {e[2] for e in evidence} <= {"same SUCI"} | {e[2] for e in want.links}
    assert {e for e in evidence if e[2] != "same SUCI"} <= want.links
    # each link listed once, and only while its two contexts were not yet joined (no duplicate evidence)
    assert sorted(e for e in evidence if e[2] != "same SUCI") == sorted(want.listed)
    assert sorted(map(sorted, (set(g["ues"]) for g in ues["linked_ue_groups"]))) == sorted(map(sorted, want.groups))
    refused = [(r["ue"], r["not_linked_to"], r["evidence"], tuple(r["frames"]), r["why"]) for r in ues["not_linked"]]
    assert set(refused) == want.refused and len(refused) == len(want.refused)  # each refusal once


def test_the_corpus_exercises_every_field() -> None:
    """The comparison above is only as strong as the values the corpus holds: each field must take
    a non-empty value somewhere (an SD, a downlink tunnel, a TMSI ...), or a swapped or lost value
    could pass unseen."""
    if not CAPTURES:
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    seen: set[str] = set()
    for path in CAPTURES:
        if path.name in CANNOT_TELL:
            continue
        want = ngap_fields_oracle.answer(path)
        seen |= {name for ue in want.ues.values() for name in UE_FIELDS if ue[name]}
        for s in want.sessions.values():
            seen |= {name for name in SESSION_FIELDS if getattr(s, name)}
            if s.s_nssai and s.s_nssai.get("sd"):
                seen.add("s_nssai.sd")
    # `release`: no capture of the corpus has a 5GSM PDU session release, `returned_by_amf_frame` no DL NAS
    # transport returning a 5GSM message, none an additional N3 tunnel (checked with tshark; the built captures
    # of test_ngap_tunnels.py have them).
    assert seen >= {*UE_FIELDS, *SESSION_FIELDS, "s_nssai.sd"} - {
        "release", "returned_by_amf_frame", "n3_uplink_additional", "n3_downlink_additional"}, seen


def tshark_frames(path: Path, display_filter: str) -> list[int]:
    """The frames tshark's display filter selects (kept on disk: the mutation gate asks often)."""
    kind = "frames-" + hashlib.sha256(display_filter.encode()).hexdigest()[:12]
    return ngap_oracle.disk_cached(path, kind, functools.partial(_frames, display_filter))


def _frames(display_filter: str, path: Path) -> list[int]:
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-Y", display_filter, "-T", "fields", "-e", "frame.number"],
                         check=True, capture_output=True, text=True).stdout
    return [int(n) for n in out.split()]


def test_empty_and_partial_answers_say_why() -> None:
    """The reasons and warnings docs/5g.md promises, on a real capture's PDUs or a part of them."""
    path = PCAPS / "adrian_registration_reject.pcap"
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    pdus = [pdu for number, answer in sorted(ngap_trees(path).items())
            for pdu in ngap.pdus_in_frame(number, answer["tree"])]
    nothing = "no NGAP over SCTP in the capture"
    for summary in (ngap.ue_sessions, ngap.pdu_sessions):
        assert summary(ngap.build_model([]))["reason"] == nothing
        assert summary(ngap.build_model([]), filtered=True)["reason"] == f"{nothing} that matches the display filter"
    # Only the non-UE procedures (NGSetup): no UE context, no session, and each answer says so.
    setup = [p for p in pdus if p.ran_ue_id is None and p.amf_ue_id is None]
    assert [p.frame for p in setup] == tshark_frames(path, "ngap.procedureCode == 21")
    assert ngap.ue_sessions(ngap.build_model(setup))["reason"] == (
        "no UE-associated NGAP PDU (only non-UE procedures such as NGSetup)")
    no_session = "no PDU session establishment (5GSM) and no N2 PDU session resource setup in the NGAP PDUs"
    assert ngap.pdu_sessions(ngap.build_model(setup))["reason"] == no_session
    undecoded = [dataclasses.replace(setup[0], nas_undecoded=1), *setup[1:]]
    assert ngap.pdu_sessions(ngap.build_model(undecoded))["reason"] == f"{no_session}; NAS did not decode, see warnings"
    # A display filter: the same answer, plus a warning that it was judged on the filtered frames only.
    for summary, warning in ((ngap.ue_sessions, "contexts, links and unanswered requests are judged on the "
                                                "filtered NGAP frames only"),
                             (ngap.pdu_sessions, "sessions are built from the filtered NGAP frames only")):
        built = ngap.build_model(pdus)
        plain, filtered = summary(built), summary(built, filtered=True)
        assert filtered["warnings"] == [*plain["warnings"], f"display_filter given: {warning}"]
        assert {**filtered, "warnings": plain["warnings"]} == plain and "reason" not in plain
    # Setup responses whose request is not among the PDUs (a capture started later) open no session.
    later = [p for p in pdus if not (p.procedure_code == 29 and p.initiating)]
    responses = tshark_frames(path, "ngap.procedureCode == 29 && ngap.successfulOutcome_element")
    assert responses and ngap.pdu_sessions(ngap.build_model(later))["warnings"] == [
        f"N2 PDU session setup responses without a request in the capture (frames {responses}): ignored"]
    later_sessions = ngap.pdu_sessions(ngap.build_model(later))["sessions"]
    assert all(s["setup_response_frame"] not in responses for s in later_sessions)
