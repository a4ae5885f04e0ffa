"""Home-routed roaming: the V-SMF's Nsmf_PDUSession Create at the H-SMF belongs to the session's `n4_sbi`.

POST .../nsmf-pdusession/v1/pdu-sessions (TS 29.502 5.2.2.7.1) is the V-SMF asking the H-SMF to create the
home-routed PDU session: an SBI call of that establishment, though the AMF never sends it. No corpus capture
has one, so tests/support/built_roaming.py adds two (a 503, then a 201 from another H-SMF) to a real run where
two establishments are under way at once: the time window cannot tell them apart, only what each message
carries can (its JSON's SUPI and PDU session id, the UE address the H-SMF's answer allocated). diagd's links
are compared with tests/support/procedures_oracle.core_links, which reads the same from `tshark -T fields`.
"""

from __future__ import annotations

import pytest

from diagd.actors.pcap import ngap
from tests.actors.pcap.test_ngap_fields import ue_keys
from tests.actors.pcap.test_ngap_procedures_model import check, core_rows
from tests.pcaps import PCAPS
from tests.support import built_roaming, procedures_oracle
from tests.support.sharkd_trees import ngap_trees

RULE = "tcp.port==7777,http2"


def test_a_v_smf_create_at_the_h_smf_joins_the_home_routed_session() -> None:
    path = built_roaming.built()
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    pdus = [pdu for number, answer in sorted(ngap_trees(path).items())
            for pdu in ngap.pdus_in_frame(number, answer["tree"])]
    result = ngap.procedures(ngap.build_model(pdus), core_rows=core_rows(path, RULE))
    check(result, path)
    requests, want = procedures_oracle.core_links(path, RULE)
    keys = ue_keys(result)
    est = [(u["ue"], p) for u in result["ues"] for p in u["procedures"]
           if p["procedure"] == "PDU Session Establishment"]
    got = {(keys[ue], p["pdu_session_id"], p["first_frame"]): sorted(
        procedures_oracle.Link(m["interface"], m["frame"], m["response_frame"], next(
            by for by, says in (("UE IPv4", "UE IPv4 "), ("SUPI", "SUPI "), ("window", "timing window"))
            if m["linked_by"].startswith(says))) for m in p["n4_sbi"]) for ue, p in est}
    assert got == {k: sorted(v) for k, v in want.items()}
    assert result["n4_sbi"] == {"n4_sbi_messages": requests, "unattached": requests - sum(map(len, want.values()))}
    creates = [(ue, m["frame"], m["result"], m["linked_by"]) for ue, p in est for m in p["n4_sbi"]
               if m["message"] == "Nsmf_PDUSession Create"]
    oracle = sorted(link.frame for links in want.values() for link in links if link.interface == "SBI")
    assert len(creates) == 2 and {c[1] for c in creates} <= set(oracle)
    # UE 3's: the 503 by the SUPI and PDU session id of its JSON, the 201 by the UE address the H-SMF allocated.
    assert [(ue, result_, by) for ue, _, result_, by in creates] == [
        ("A1/amf-3/ran-3", "HTTP 503", f"SUPI {built_roaming.SUPI} and PDU session id 1 in the body = the UE's SUCI "
                                       "(null scheme) and its session, in its time window"),
        ("A1/amf-3/ran-3", "HTTP 201", f"UE IPv4 {built_roaming.UE_IPV4} in the answer's ueIpv4Address = PDU address "
                                       "in the NAS accept")]
    # The window alone could not have told: UE 2's unanswered establishment is under way too.
    windows = [p for _, p in est if p["first_frame"] <= creates[0][1] and (
        p["outcome"] == "incomplete" or creates[0][1] <= p["last_frame"])]
    assert len(windows) == 2
