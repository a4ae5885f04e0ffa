"""Protocol-tree helpers and NGAP summaries on small hand-written sharkd trees (no sharkd needed)."""

from __future__ import annotations

import base64
from typing import Any

from diagd.actors import _pcap_ngap as ngap
from diagd.actors import _pcap_tree as tree


def node(label: str, f: str | None = None, children: list[dict[str, Any]] | None = None,
         proto: bool = False) -> dict[str, Any]:
    n: dict[str, Any] = {"l": label}
    if f:
        n["f"] = f
    if children:
        n["n"] = children
    if proto:
        n["t"] = "proto"
    return n


def ngap_pdu(pdu_type: str, code: int, name: str, ran: int, extra: list[dict[str, Any]]) -> dict[str, Any]:
    return node(f"NG Application Protocol ({name})", "ngap", [
        node(f"NGAP-PDU: {pdu_type}", f"ngap.NGAP_PDU == {pdu_type}", [
            node(f"procedureCode: id-{name} ({code})", f"ngap.procedureCode == {code}"),
            node(f"RAN-UE-NGAP-ID: {ran}", f"ngap.RAN_UE_NGAP_ID == {ran}"),
            *extra,
        ]),
    ], proto=True)


FRAME = [
    node("Frame 19", "frame", [node("Epoch Time: 100.5 seconds", "frame.time_epoch == 100.500000000")], proto=True),
    node("Ethernet II", "eth", [node("Type: IPv4 (0x0800)", "eth.type == 0x0800")], proto=True),
    ngap_pdu("0", 4, "DownlinkNASTransport", 2, [
        node("AMF-UE-NGAP-ID: 2", "ngap.AMF_UE_NGAP_ID == 2"),
        node("Non-Access-Stratum 5GS (NAS)PDU", "nas-5gs", [
            node("Message type: Registration reject (0x44)", "nas_5gs.mm.message_type == 0x44"),
            node("5GMM cause: 5GS services not allowed (7)", "nas_5gs.mm.5gmm_cause == 7"),
        ], proto=True),
    ]),
    ngap_pdu("0", 41, "UEContextRelease", 2, [
        node("nas: normal-release (0)", "ngap.nas == 0"),
    ]),
]


def test_raw_values_come_from_filter_strings_in_tree_order() -> None:
    values = tree.field_values(FRAME, {"ngap.procedureCode", "ngap.RAN_UE_NGAP_ID", "nas_5gs.mm.message_type"})
    assert values == {"ngap.procedureCode": ["4", "41"], "ngap.RAN_UE_NGAP_ID": ["2", "2"],
                      "nas_5gs.mm.message_type": ["0x44"]}


def test_quoted_values_are_unquoted() -> None:
    assert tree.parse_f('sip.Call-ID == "abc\\"d@x"') == ("sip.Call-ID", 'abc"d@x')
    assert tree.parse_f("ngap") == ("ngap", None)


def test_layers_cut_the_text_to_nested_protocol_subtrees() -> None:
    nas = tree.protocol_nodes(FRAME, {"nas-5gs"})
    text = tree.render(nas)
    assert text.splitlines() == [
        "Non-Access-Stratum 5GS (NAS)PDU",
        "    Message type: Registration reject (0x44)",
        "    5GMM cause: 5GS services not allowed (7)",
    ]
    assert len(tree.protocol_nodes(FRAME, {"ngap"})) == 2
    assert tree.top_protocols(FRAME) == ["frame", "eth", "ngap", "ngap"]


def test_hexdump_looks_like_tshark_x() -> None:
    dump = tree.hexdump(base64.b64encode(b"GET / HTTP/1.1\r\nHost").decode())
    # tshark -x puts three spaces between the hex and the text column (epan/print.c)
    assert dump.splitlines()[0] == "0000  47 45 54 20 2f 20 48 54 54 50 2f 31 2e 31 0d 0a   GET / HTTP/1.1.."
    assert dump.splitlines()[1].startswith("0010  48 6f 73 74")


def test_each_bundled_ngap_pdu_is_its_own_record() -> None:
    pdus = ngap.pdus_in_frame(19, FRAME)
    assert [(p.procedure, p.procedure_code, p.pdu_type, p.ran_ue_id) for p in pdus] == [
        ("DownlinkNASTransport", 4, "initiatingMessage", "2"), ("UEContextRelease", 41, "initiatingMessage", "2")]
    assert pdus[0].time == 100.5
    assert pdus[0].causes == [{"frame": 19, "kind": "5GMM", "code": 7, "cause": "5GS services not allowed",
                               "message": "Registration reject"}]


def test_ue_summary_marks_the_reject_and_ignores_a_normal_release() -> None:
    summary = ngap.ue_sessions(ngap.pdus_in_frame(19, FRAME))
    (ue,) = summary["ues"]
    assert ue["registration"] == "rejected" and ue["amf_ue_ngap_id"] == 2
    assert [f["code"] for f in ue["failures"]] == [7]  # nas: normal-release is not a failure
    assert summary["failed_ues"] == [2]
