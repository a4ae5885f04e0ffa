"""Every field of the NGAP UE-context and PDU-session answers against tshark -T fields, on every corpus capture.

The NGAP model runs in-process on the real sharkd trees of each capture (fetched once, cached:
tests/support/sharkd_trees.py), fast enough for the mutation gate (scripts/mutation.sh); the same
comparison runs through the daemon in tests/e2e/test_ngap_summaries.py. The second answer is
tests/support/ngap_fields_oracle.py, which never imports diagd.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from diagd.actors.pcap import ngap
from tests.pcaps import PCAPS, corpus
from tests.support import ngap_fields_oracle, ngap_oracle
from tests.support.sharkd_trees import ngap_trees

CAPTURES = corpus()
# Captures this oracle cannot read unambiguously, and why: it says so (raises) instead of guessing,
# and the test checks it still does, so an oracle that learns them has this list shortened.
CANNOT_TELL = {
    "ngtester_chain_free5gc_pathswitch_then_release_amf_ngap_nas_sbi.pcap": "a path switch",
    "ngtester_open5gs_ho_window_p21_p09_amf_ngap_nas_sbi.pcap": "RAN id 99 reused",
    "ngtester_chain_oai_initue_then_release_amf_ngap_nas_sbi.pcap": "RAN id 99 reused",
}
UE_FIELDS = ("frames", "5g_tmsi", "plmn")
SESSION_FIELDS = ("dnn", "ue_ipv4", "s_nssai", "n3_uplink", "n3_downlink", "qfis", "release")


def ue_keys(result: dict[str, Any]) -> dict[str, ngap_oracle.UeKey]:
    """{UE label: (endpoint, endpoint, association index, AMF id, RAN id)} of an ngap_ue_sessions answer."""
    assoc = {a["association"]: (a["endpoints"][0], a["endpoints"][1], a["sctp_assoc_index"])
             for a in result["associations"]}
    return {u["ue"]: (*assoc[u["association"]], u["amf_ue_ngap_id"], u["ran_ue_ngap_id"]) for u in result["ues"]}


def octets(value: Any) -> Any:
    """Byte strings as tshark -T fields prints them (hex, no separators); other values unchanged."""
    if isinstance(value, str) and all(c in "0123456789abcdef:" for c in value):
        return value.replace(":", "")
    if isinstance(value, dict):
        return {k: octets(v) for k, v in value.items()}
    return value


def compare_fields(ues: dict[str, Any], sessions: dict[str, Any], want: ngap_fields_oracle.Fields) -> int:
    """Assert every UE and session field equals the oracle's; returns how many values were compared."""
    keys = ue_keys(ues)
    assert sorted(keys.values(), key=repr) == sorted(want.ues, key=repr)
    compared = 0
    for ue in ues["ues"]:
        expected = want.ues[keys[ue["ue"]]]
        for name in UE_FIELDS:
            assert (ue["ue"], name, ue[name]) == (ue["ue"], name, expected[name])
            compared += 1
    got = {(keys[s["ue"]], s["pdu_session_id"], s["establishment"]): s for s in sessions["sessions"]}
    assert sorted(got, key=repr) == sorted(want.sessions, key=repr)
    for key, s in got.items():
        expected_session = want.sessions[key]
        for name in SESSION_FIELDS:
            value = octets(s[name]) if name in ("s_nssai", "n3_uplink", "n3_downlink") else s[name]
            assert (s["ue"], s["pdu_session_id"], name, value) == \
                (s["ue"], s["pdu_session_id"], name, getattr(expected_session, name))
            compared += 1
    return compared


def model(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    pdus = [pdu for number, answer in sorted(ngap_trees(path).items())
            for pdu in ngap.pdus_in_frame(number, answer["tree"])]
    return ngap.ue_sessions(pdus), ngap.pdu_sessions(pdus)


@pytest.mark.parametrize("path", CAPTURES or [PCAPS / "(no corpus)"], ids=lambda p: p.name)
def test_every_field_agrees_with_tshark_fields(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    if path.name in CANNOT_TELL:
        with pytest.raises(ngap_oracle.OracleCannotTell, match=CANNOT_TELL[path.name]):
            ngap_fields_oracle.answer(path)
        return
    ues, sessions = model(path)
    want = ngap_fields_oracle.answer(path)
    compare_fields(ues, sessions, want)
    if not want.ues:
        assert ues["ue_count"] == 0 and sessions["session_count"] == 0


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
    # `release`: no capture of the corpus has a 5GSM PDU session release (checked with tshark).
    assert seen >= {*UE_FIELDS, *SESSION_FIELDS, "s_nssai.sd"} - {"release"}, seen
