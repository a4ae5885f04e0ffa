"""Protocol-tree helpers and NGAP summaries on small hand-written sharkd trees (no sharkd needed)."""

from __future__ import annotations

import base64
from typing import Any

from diagd.actors.pcap import ngap
from diagd.actors.pcap.shark import tree


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
    summary = ngap.ue_sessions(ngap.build_model(ngap.pdus_in_frame(19, FRAME)))
    (ue,) = summary["ues"]
    assert ue["registration"] == "rejected" and ue["amf_ue_ngap_id"] == 2
    assert [f["code"] for f in ue["failures"]] == [7]  # nas: normal-release is not a failure
    assert [(u["ran_ue_ngap_id"], u["amf_ue_ngap_id"]) for u in summary["failed_ues"]] == [(2, 2)]
    assert summary["failed_ues"][0]["reasons"] == [{"frame": 19, "kind": "5GMM", "code": 7,
                                                    "cause": "5GS services not allowed", "why": "Registration reject"}]


# --- Trees shaped like sharkd's: frame / ip / sctp / NGAP PDUs with protocolIEs items ---------------------------


def ie(ie_id: int, name: str, *value: dict[str, Any]) -> dict[str, Any]:
    return node(f"Item: id-{name}", None, [node("ProtocolIE-Field", None, [
        node(f"id: id-{name} ({ie_id})", f"ngap.id == {ie_id}"), node("value", None, list(value))])])


def ids(amf: int | None = None, ran: int | None = None) -> list[dict[str, Any]]:
    out = []
    if amf is not None:
        out.append(ie(10, "AMF-UE-NGAP-ID", node(f"AMF-UE-NGAP-ID: {amf}", f"ngap.AMF_UE_NGAP_ID == {amf}")))
    if ran is not None:
        out.append(ie(85, "RAN-UE-NGAP-ID", node(f"RAN-UE-NGAP-ID: {ran}", f"ngap.RAN_UE_NGAP_ID == {ran}")))
    return out


def cause(group: str, code: int, text: str) -> dict[str, Any]:
    return ie(15, "Cause", node(f"{group}: {text} ({code})", f"ngap.{group} == {code}"))


def nas(*messages: tuple[str, str, str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A NAS-PDU IE: (field, code, name, extra fields) per plain message, nested one in the next."""
    inner: list[dict[str, Any]] = []
    for field, code, name, extra in reversed(messages):
        inner = [node("Plain NAS 5GS Message", None, [node(f"Message type: {name} ({code})", f"{field} == {code}"),
                                                      *extra, *inner])]
    return ie(38, "NAS-PDU", node("NAS-PDU", "ngap.NAS_PDU == 00", [node("NAS", "nas-5gs", inner, proto=True)]))


def pdu(pdu_type: int, code: int, name: str, *ies: dict[str, Any]) -> dict[str, Any]:
    return node(f"NG Application Protocol ({name})", "ngap", [
        node(f"NGAP-PDU: {pdu_type}", f"ngap.NGAP_PDU == {pdu_type}", [
            node(f"procedureCode: id-{name} ({code})", f"ngap.procedureCode == {code}"),
            node("value", None, [node(name, None, [node(f"protocolIEs: {len(ies)} items",
                                                        f"ngap.protocolIEs == {len(ies)}", list(ies))])]),
        ]),
    ], proto=True)


def frame(number: int, gnb: str, *pdus: dict[str, Any], to_amf: bool = True, index: int = 0,
          amf: str = "10.0.0.1") -> tuple[int, list[dict[str, Any]]]:
    src, dst = (gnb, amf) if to_amf else (amf, gnb)
    ports = (50000, 38412) if to_amf else (38412, 50000)
    return number, [
        node(f"Frame {number}", "frame", [node("Epoch", f"frame.time_epoch == {number}.0")], proto=True),
        node("IPv4", "ip", [node("src", f"ip.src == {src}"), node("dst", f"ip.dst == {dst}")], proto=True),
        node("SCTP", "sctp", [node("sp", f"sctp.srcport == {ports[0]}"), node("dp", f"sctp.dstport == {ports[1]}"),
                              node("ai", f"sctp.assoc_index == {index}")], proto=True),
        *pdus,
    ]


def summarize(*frames: tuple[int, list[dict[str, Any]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    pdus = [p for number, tree_ in frames for p in ngap.pdus_in_frame(number, tree_)]
    model = ngap.build_model(pdus)
    return ngap.ue_sessions(model), ngap.pdu_sessions(model)


MM, SM = "nas_5gs.mm.message_type", "nas_5gs.sm.message_type"
INITIAL = (0, 15, "InitialUEMessage")
DOWNLINK = (0, 4, "DownlinkNASTransport")
UPLINK = (0, 46, "UplinkNASTransport")


def test_same_ids_on_two_gnbs_are_two_ues_and_each_failure_stays_with_its_own() -> None:
    ues, _ = summarize(
        frame(1, "10.1.0.1", pdu(*INITIAL, *ids(ran=1))),
        frame(2, "10.2.0.1", pdu(*INITIAL, *ids(ran=1))),
        frame(3, "10.1.0.1", pdu(*DOWNLINK, *ids(1, 1)), to_amf=False),
        frame(4, "10.2.0.1", pdu(*DOWNLINK, *ids(7, 1), nas((MM, "0x44", "Registration reject", [
            node("5GMM cause: Illegal UE (3)", "nas_5gs.mm.5gmm_cause == 3")]))), to_amf=False),
    )
    assert [(u["gnb"], u["amf_ue_ngap_id"], u["ran_ue_ngap_id"]) for u in ues["ues"]] == [
        ("10.1.0.1:50000", 1, 1), ("10.2.0.1:50000", 7, 1)]
    assert [(f["ue"], [r["frame"] for r in f["reasons"]]) for f in ues["failed_ues"]] == [("A2/amf-7/ran-1", [4])]


def test_ids_reused_after_a_release_or_by_another_amf_id_start_a_new_context() -> None:
    ues, _ = summarize(
        frame(1, "g", pdu(*INITIAL, *ids(ran=1))),
        frame(2, "g", pdu(*DOWNLINK, *ids(1, 1)), to_amf=False),
        frame(3, "g", pdu(0, 41, "UEContextRelease", *ids(1, 1), cause("nas", 0, "normal-release")), to_amf=False),
        frame(4, "g", pdu(1, 41, "UEContextRelease", *ids(1, 1))),
        frame(5, "g", pdu(*INITIAL, *ids(ran=1))),
        frame(6, "g", pdu(*DOWNLINK, *ids(2, 1)), to_amf=False),
        frame(7, "g", pdu(*DOWNLINK, *ids(3, 1)), to_amf=False),  # no InitialUEMessage: capture or gNB lost it
    )
    assert [(u["ue"], u["frames"], u["ended"]) for u in ues["ues"]] == [
        ("A1/amf-1/ran-1", [1, 2, 3, 4], "UEContextReleaseComplete in frame 4"),
        ("A1/amf-2/ran-1", [5, 6], "ids reused by a different UE in frame 7"),
        ("A1/amf-3/ran-1", [7], None)]
    assert ues["failed_ues"] == [] and any("no InitialUEMessage" in w for w in ues["warnings"])


def test_normal_release_causes_are_not_failures_abnormal_ones_are() -> None:
    sm_release = (SM, "0xd3", "PDU session release command", [
        node("PDU session identity: 1", "nas_5gs.pdu_session_id == 1")])
    ues, _ = summarize(
        frame(1, "g", pdu(*INITIAL, *ids(ran=1))),
        frame(2, "g", pdu(0, 42, "UEContextReleaseRequest", *ids(1, 1),
                          cause("radioNetwork", 20, "user-inactivity"))),
        frame(3, "g", pdu(*DOWNLINK, *ids(1, 1), nas((sm_release[0], sm_release[1], sm_release[2], [
            *sm_release[3], node("5GSM cause: Regular deactivation (36)", "nas_5gs.sm.5gsm_cause == 36")]))),
            to_amf=False),
        frame(4, "g", pdu(*UPLINK, *ids(1, 1), nas((MM, "0x45", "Deregistration request (UE originating)", [])))),
        frame(5, "g", pdu(0, 42, "UEContextReleaseRequest", *ids(1, 1),
                          cause("radioNetwork", 21, "radio-connection-with-ue-lost"))),
        frame(6, "g", pdu(*DOWNLINK, *ids(1, 1), nas((sm_release[0], sm_release[1], sm_release[2], [
            *sm_release[3], node("5GSM cause: Insufficient resources (26)", "nas_5gs.sm.5gsm_cause == 26")]))),
            to_amf=False),
    )
    (ue,) = ues["ues"]
    assert [(f["frame"], f["kind"], f["code"], f["why"]) for f in ue["failures"]] == [
        (5, "NGAP", 21, "abnormal release cause in UEContextReleaseRequest"),
        (6, "5GSM", 26, "abnormal cause in PDU session release command")]
    assert ue["registration"] == "deregistered"


def test_an_unanswered_request_fails_only_if_the_association_went_on() -> None:
    setup = pdu(0, 14, "InitialContextSetup", *ids(1, 1))
    ues, _ = summarize(frame(1, "g", pdu(*INITIAL, *ids(ran=1))), frame(2, "g", setup, to_amf=False))
    assert ues["failed_ues"] == [] and [p["frame"] for p in ues["ues"][0]["pending_requests"]] == [2]
    ues, _ = summarize(frame(1, "g", pdu(*INITIAL, *ids(ran=1))), frame(2, "g", setup, to_amf=False),
                       frame(3, "g", pdu(*INITIAL, *ids(ran=2))))
    assert [(f["frame"], f["why"].split(" (")[0]) for f in ues["ues"][0]["failures"]] == [
        (2, "no response to InitialContextSetup request")]
    ues, _ = summarize(frame(1, "g", pdu(*INITIAL, *ids(ran=1))), frame(2, "g", setup, to_amf=False),
                       frame(3, "g", pdu(2, 14, "InitialContextSetup", *ids(1, 1),
                                         cause("radioNetwork", 22, "radio-resources-not-available"))))
    assert [(f["frame"], f["code"], f["why"]) for f in ues["ues"][0]["failures"]] == [
        (3, 22, "InitialContextSetup failed (unsuccessfulOutcome)")]


def test_failed_pdu_session_setup_is_rejected_and_a_response_never_precedes_its_request() -> None:
    def items(ie_id: int, name: str, psi: int, *inner: dict[str, Any]) -> dict[str, Any]:
        return ie(ie_id, name, node(f"{name}: 1 item", f"ngap.{name} == 1", [node("Item 0", None, [
            node(f"pDUSessionID: {psi}", f"ngap.pDUSessionID == {psi}"), *inner])]))

    accept = nas((MM, "0x68", "DL NAS transport", []), (SM, "0xc2", "PDU session establishment accept", [
        node("PDU session identity: 5", "nas_5gs.pdu_session_id == 5")]))
    _, sessions = summarize(
        frame(1, "g", pdu(*INITIAL, *ids(ran=1))),
        frame(2, "g", pdu(1, 29, "PDUSessionResourceSetup", *ids(1, 1), items(75, "SetupListSURes", 5))),
        frame(3, "g", pdu(*UPLINK, *ids(1, 1), nas((MM, "0x67", "UL NAS transport", []), (
            SM, "0xc1", "PDU session establishment request", [node("PSI: 5", "nas_5gs.pdu_session_id == 5")])))),
        frame(4, "g", pdu(0, 29, "PDUSessionResourceSetup", *ids(1, 1), items(74, "SetupListSUReq", 5), accept),
              to_amf=False),
        frame(5, "g", pdu(1, 29, "PDUSessionResourceSetup", *ids(1, 1), items(
            58, "FailedToSetupListSURes", 5,
            node("radioNetwork: slice-not-supported (39)", "ngap.radioNetwork == 39")))),
    )
    (s,) = sessions["sessions"]  # frame 2 answers no request: it opens nothing
    assert (s["establishment_request_frame"], s["establishment_accept_frame"], s["setup_request_frame"],
            s["setup_response_frame"], s["status"]) == (3, 4, 4, 5, "setup_failed")
    assert sessions["established_count"] == 0 and sessions["rejected"] == [s]
    assert [(f["frame"], f["code"], f["cause"]) for f in s["failures"]] == [(5, 39, "slice-not-supported")]


def test_contexts_are_linked_only_on_evidence_and_say_which() -> None:
    container = ie(101, "SourceToTarget-TransparentContainer",
                   node("c", "ngap.SourceToTarget_TransparentContainer == 0a:0b"))
    tmsi = nas((MM, "0x42", "Registration accept", [node("5G-TMSI: 9", "nas_5gs.5g_tmsi == 9")]))
    source_amf = ie(100, "SourceAMF-UE-NGAP-ID", node("AMF-UE-NGAP-ID: 1", "ngap.AMF_UE_NGAP_ID == 1"))
    ues, _ = summarize(
        frame(1, "10.1.0.1", pdu(*INITIAL, *ids(ran=1))),
        frame(2, "10.1.0.1", pdu(*DOWNLINK, *ids(1, 1), tmsi), to_amf=False),
        frame(3, "10.1.0.1", pdu(0, 12, "HandoverPreparation", *ids(1, 1), container)),
        frame(4, "10.2.0.1", pdu(0, 13, "HandoverResourceAllocation", *ids(amf=2), container), to_amf=False),
        frame(5, "10.2.0.1", pdu(1, 13, "HandoverResourceAllocation", *ids(2, 8))),
        frame(6, "10.3.0.1", pdu(0, 25, "PathSwitchRequest", *ids(ran=4), source_amf)),
        frame(7, "10.3.0.1", pdu(1, 25, "PathSwitchRequest", *ids(3, 4)), to_amf=False),
        frame(8, "10.4.0.1", pdu(*INITIAL, *ids(ran=1),
                                 ie(26, "FiveG-S-TMSI", node("t", "ngap.fiveG_TMSI == 00:00:00:09")))),
        frame(9, "10.5.0.1", pdu(*DOWNLINK, *ids(5, 1), tmsi), to_amf=False),  # same TMSI assigned again: no link
    )
    assert [(u["ue"], u["amf_ue_ngap_id"], u["ran_ue_ngap_id"], u["linked_group"]) for u in ues["ues"]] == [
        ("A1/amf-1/ran-1", 1, 1, 1), ("A2/amf-2/ran-8", 2, 8, 1), ("A3/amf-3/ran-4", 3, 4, 1),
        ("A4/amf-?/ran-1", None, 1, 1), ("A5/amf-5/ran-1", 5, 1, None)]
    (group,) = ues["linked_ue_groups"]
    assert [(e["ue"], e["linked_to"], e["evidence"].split(":")[0]) for e in group["evidence"]] == [
        ("A2/amf-2/ran-8", "A1/amf-1/ran-1", "handover"), ("A3/amf-3/ran-4", "A1/amf-1/ran-1", "path switch"),
        ("A4/amf-?/ran-1", "A1/amf-1/ran-1", "5G-TMSI assigned in frame 2, presented in frame 8")]


def test_an_ng_reset_ends_the_contexts_of_its_association_only() -> None:
    reset = pdu(0, 20, "NGReset", cause("misc", 3, "om-intervention"),
                ie(88, "ResetType", node("ResetType: nG-Interface (0)", "ngap.ResetType == 0",
                                         [node("nG-Interface: reset-all (0)", "ngap.nG_Interface == 0")])))
    ues, _ = summarize(
        frame(1, "g1", pdu(*INITIAL, *ids(ran=1))), frame(2, "g2", pdu(*INITIAL, *ids(ran=1))),
        frame(3, "g1", reset, to_amf=False), frame(4, "g1", pdu(1, 20, "NGReset")),
        frame(5, "g1", pdu(*DOWNLINK, *ids(1, 1)), to_amf=False),
        frame(6, "g2", pdu(*DOWNLINK, *ids(1, 1)), to_amf=False),
    )
    assert [(u["ue"], u["frames"], u["ended"]) for u in ues["ues"]] == [
        ("A1/amf-?/ran-1", [1], "NGReset (whole interface) in frame 3"), ("A2/amf-1/ran-1", [2, 6], None),
        ("A1/amf-1/ran-1", [5], None)]
    assert ues["non_ue_failures"] == [] and ues["failed_ues"] == []
    assert [p["procedure"] for p in ues["associations"][0]["procedures"]] == ["NGReset", "NGReset"]


def test_a_value_the_reader_does_not_expect_is_a_warning_not_a_traceback() -> None:
    odd = ie(85, "RAN-UE-NGAP-ID", node("RAN-UE-NGAP-ID: ?", "ngap.RAN_UE_NGAP_ID == banana"))
    ues, sessions = summarize(frame(1, "g", pdu(*INITIAL, *ids(ran=1))), frame(2, "g", pdu(*UPLINK, odd)))
    assert ues["ue_count"] == 1 and any("read only in part" in w and "frame 2" in w for w in ues["warnings"])
    assert sessions["reason"].startswith("no PDU session establishment")


def test_sharkds_coloring_items_are_left_out_as_tshark_v_leaves_them_out() -> None:
    frame = {"l": "Frame 1", "f": "frame", "t": "proto", "n": [
        {"l": "Frame Number: 1", "f": "frame.number == 1"},
        {"l": "[Coloring Rule Name: TCP]", "f": 'frame.coloring_rule.name == "TCP"'},
        {"l": "[Coloring Rule String: tcp]", "f": 'frame.coloring_rule.string == "tcp"'}]}
    shown = tree.with_displayed_delta([frame], 0)
    assert [n["l"] for n in shown[0]["n"]] == ["Frame Number: 1"]
    assert len(frame["n"]) == 3  # the cached tree is left alone
