"""sequence.py on hand-written rows: escaping, roles from protocol evidence, failure arrows, gap notes."""

from __future__ import annotations

from typing import Any

from diagd.actors.pcap import sequence_tool
from diagd.actors.pcap.answers import sequence
from tests.support import mermaid


def row(frame: int, time: float, src: str, dst: str, proto: str, info: str, **fields: Any) -> dict[str, Any]:
    return {"frame.number": frame, "frame.time_epoch": str(time), "ip.src": src, "ip.dst": dst,
            "_ws.col.Protocol": proto, "_ws.col.Info": info, **fields}


def test_text_that_mermaid_reads_as_syntax_is_replaced() -> None:
    text = sequence.safe('a;b #1 <unknown> c-->>d\nx "q" {j}')
    assert not set(text) & set(';#<>\n"{}') and "-->>" not in text


def test_roles_come_from_ngap_pfcp_and_sbi_and_conflicting_evidence_keeps_the_address() -> None:
    drawn = sequence.build([
        row(1, 0.0, "10.0.0.5", "10.0.0.1", "NGAP", "InitialUEMessage", **{"sctp.dstport": "38412"}),
        row(2, 0.1, "10.0.0.2", "10.0.0.3", "PFCP", "PFCP Session Establishment Request",
            **{"pfcp.msg_type": "50"}),
        row(3, 0.2, "10.0.0.1", "10.0.0.9", "HTTP2", "HEADERS[1]: POST /nsmf-pdusession/v1/sm-contexts",
            **{"http2.headers.path": "/nsmf-pdusession/v1/sm-contexts"}),
        row(4, 0.3, "10.0.0.1", "10.0.0.9", "HTTP2", "HEADERS[3]: GET /nudm-sdm/v2/x",
            **{"http2.headers.path": "/nudm-sdm/v2/x"}),
    ])
    roles = {p["address"]: p["role"] for p in drawn.describe()["participants"]}
    assert roles == {"10.0.0.5": "gNB", "10.0.0.1": "AMF", "10.0.0.2": "SMF", "10.0.0.3": "UPF", "10.0.0.9": None}


def test_a_failure_is_a_crossed_arrow_with_its_cause_and_a_long_pause_a_note() -> None:
    drawn = sequence.build([
        row(1, 0.0, "1.1.1.1", "2.2.2.2", "SIP", "Request: INVITE sip:a@b;user=phone |"),
        row(2, 0.1, "2.2.2.2", "1.1.1.1", "SIP", "Status: 100 Trying |"),
        row(4, 0.2, "2.2.2.2", "1.1.1.1", "SIP", "Status: 180 Ringing |"),
        row(3, 9.2, "2.2.2.2", "1.1.1.1", "SIP", "Status: 486 Busy Here |", **{"sip.Status-Code": "486"}),
    ])
    text = drawn.mermaid()
    _, arrows = mermaid.read(text)
    assert [a.failed for a in arrows] == [False, False, False, True]
    assert arrows[0].text == "[1] SIP Request: INVITE sip:a@b,user=phone"
    assert "Note over N_2,N_1: +9.000 s" in text and "Note right of N_1: SIP 486" in text


def test_sctp_chunks_and_diameter_hop_ids_are_left_out_of_the_text() -> None:
    assert sequence.clean_info("NGAP", "SACK (Ack=1, Arwnd=106496) , DownlinkNASTransport, Authentication request"
                               ) == "DownlinkNASTransport, Authentication request"
    assert sequence.clean_info("DIAMETER", "cmd=Credit-Control Request(272) flags=RP-- appl=3GPP Gx(16777238) "
                               "h2h=a02cd02c e2e=cce2aeb4 | ") == "cmd=Credit-Control Request(272) flags=RP-- " \
                                                                 "appl=3GPP Gx(16777238)"
    assert sequence.clean_info("SCTP", "SACK (Ack=0, Arwnd=106427) ") == "SACK (Ack=0, Arwnd=106427)"


# What a crafted packet can put into Wireshark's Info column (a SIP Request-URI, an HTTP/2 :path): each piece
# is Mermaid syntax somewhere: a directive, an entity, a break, KaTeX (read only when rendering), a new statement.
HOSTILE = ('Request: INVITE sip:$$\\fail(x)$$@a$$\\Huge X$$%%{init:{"securityLevel":"loose"}}%%#lt;script#gt;'
           '<br>x\u2028end\u0085note;click A call f()\r\nlinks A: {"x": "javascript:alert(1)"} |')


def test_packet_text_cannot_become_mermaid_syntax_when_parsed_or_rendered() -> None:
    drawn = sequence.build([row(1, 0.0, "1.1.1.1", "2.2.2.2", "SIP", HOSTILE),
                            row(2, 0.1, "2.2.2.2", "1.1.1.1", "HTTP2", "HEADERS[1]: POST /$$\\rule(9em)(9em)$$")])
    text = drawn.mermaid()
    _, arrows = mermaid.read(text)  # every line is one diagd writes: nothing became a statement of its own
    assert [a.frame for a in arrows] == [1, 2]
    assert "$$" not in text and "%%" not in text and "<" not in text and "\u2028" not in text


def test_packet_text_stays_one_diagram_for_the_real_mermaid_parser_and_renderer() -> None:
    mermaid.require_parser()
    drawn = sequence.build([row(1, 0.0, "1.1.1.1", "2.2.2.2", "SIP", HOSTILE),
                            row(2, 0.1, "2.2.2.2", "1.1.1.1", "HTTP2", "HEADERS[1]: POST /$$\\rule(9em)(9em)$$")])
    text = drawn.mermaid()
    assert [v["ok"] for v in mermaid.parse([text])] == [True]
    assert mermaid.render([text]) == [{"ok": True}]


def test_an_all_in_one_core_is_told_apart_by_port_and_no_arrow_points_to_itself() -> None:
    """Every NF on 127.0.0.1: the AMF (38412, SBI 7001) calls the AUSF (7002); the gNB's end is its own.
    Before, one address took every vote: one lifeline, self-arrows, and the AMF shown as "AUSF"."""
    lo = "127.0.0.1"
    drawn = sequence.build([
        row(1, 0.0, lo, lo, "NGAP", "InitialUEMessage", **{"sctp.srcport": "40000", "sctp.dstport": "38412"}),
        row(2, 0.1, lo, lo, "HTTP2", "HEADERS[1]: POST /nausf-auth/v1/ue-authentications",
            **{"tcp.srcport": "51000", "tcp.dstport": "7002", "http2.headers.path": "/nausf-auth/v1/x"}),
        row(3, 0.2, lo, lo, "HTTP2", "HEADERS[1]: 201 Created", **{"tcp.srcport": "7002", "tcp.dstport": "51000"}),
        row(4, 0.3, lo, lo, "HTTP2", "HEADERS[3]: POST /namf-comm/v1/x",
            **{"tcp.srcport": "52000", "tcp.dstport": "7001", "http2.headers.path": "/namf-comm/v1/x"}),
    ])
    _, arrows = mermaid.read(drawn.mermaid())
    assert [(a.src, a.dst) for a in arrows] == [
        ("gNB 127.0.0.1:40000", "AMF 127.0.0.1:38412"), ("127.0.0.1", "AUSF 127.0.0.1:7002"),
        ("AUSF 127.0.0.1:7002", "127.0.0.1"), ("127.0.0.1", "AMF 127.0.0.1:7001")]
    assert {(p["address"], p["port"], p["role"]) for p in drawn.describe()["participants"]} == {
        (lo, "40000", "gNB"), (lo, "38412", "AMF"), (lo, "7002", "AUSF"), (lo, "7001", "AMF"), (lo, None, None)}


def test_an_address_whose_ends_all_say_one_role_stays_one_lifeline() -> None:
    drawn = sequence.build([
        row(1, 0.0, "10.0.0.2", "10.0.0.3", "PFCP", "PFCP Session Establishment Request",
            **{"udp.srcport": "8805", "udp.dstport": "8805", "pfcp.msg_type": "50"}),
        row(2, 0.1, "10.0.0.3", "10.0.0.2", "PFCP", "PFCP Heartbeat Request",
            **{"udp.srcport": "45935", "udp.dstport": "8805", "pfcp.msg_type": "1"}),
    ])
    assert [(p["name"], p["port"]) for p in drawn.describe()["participants"]] == [("SMF 10.0.0.2", None),
                                                                                 ("UPF 10.0.0.3", None)]


def test_rejects_failures_and_error_indications_are_crossed_arrows_by_their_message_type() -> None:
    """Messages that report a failure by what they are, even without a cause IE (an AUTHENTICATION REJECT
    has none, TS 24.501 8.2.5): each is `-x` with a Note naming it. A normal message stays `->>`."""
    gnb, amf = "10.0.0.5", "10.0.0.1"
    drawn = sequence.build([
        row(1, 0.0, amf, gnb, "NGAP/NAS-5GS", "DownlinkNASTransport, Authentication request",
            **{"nas_5gs.mm.message_type": "0x56"}),
        row(2, 0.1, amf, gnb, "NGAP/NAS-5GS", "DownlinkNASTransport, Authentication reject",
            **{"nas_5gs.mm.message_type": "0x58"}),
        row(3, 0.2, gnb, amf, "NGAP", "ErrorIndication", **{"ngap.procedureCode": "9"}),
        row(4, 0.3, gnb, amf, "NGAP", "NASNonDeliveryIndication", **{"ngap.procedureCode": ["46", "19"]}),
        row(5, 0.4, amf, gnb, "NGAP/NAS-5GS", "DownlinkNASTransport, 5GSM status",
            **{"nas_5gs.mm.message_type": "0x68", "nas_5gs.sm.message_type": "0xd6"}),
    ])
    _, arrows = mermaid.read(drawn.mermaid())
    assert [a.failed for a in arrows] == [False, True, True, True, True]
    assert [a.notes for a in arrows] == [(), ("AUTHENTICATION REJECT",), ("NGAP ErrorIndication",),
                                         ("NGAP NASNonDeliveryIndication",), ("5GSM STATUS",)]


def test_the_message_that_decided_a_failed_verdict_is_crossed_and_its_note_names_the_rule() -> None:
    """A PDUSessionResourceSetupResponse is a successful outcome carrying no cause field of its own: when it
    lists the session as failed (rule pdu-setup-failed) the verdict makes it `-x`, with the rule's Note."""
    procedures = [
        {"procedure": "PDU Session Establishment", "outcome": "failure", "rule_id": "pdu-setup-failed",
         "rule": "TS 38.413 8.2.1.2 / 8.3.1.3: the N2 setup response lists the session as failed to set up",
         "first_frame": 1, "last_frame": 3, "frames": [1, 2, 3]},
        {"procedure": "Registration", "outcome": "incomplete", "rule_id": "unanswered", "rule": "x",
         "first_frame": 1, "last_frame": 1, "frames": [1]},
        {"procedure": "Authentication", "outcome": "success", "rule_id": "authentication-response", "rule": "y",
         "first_frame": 1, "last_frame": 2, "frames": [1, 2]},
    ]
    verdicts = sequence_tool.decided(procedures)
    assert verdicts == {3: ["PDU Session Establishment failure: rule pdu-setup-failed, TS 38.413 8.2.1.2 / 8.3.1.3: "
                            "the N2 setup response lists the session as failed to set up"]}
    gnb, amf = "10.0.0.5", "10.0.0.1"
    drawn = sequence.build([
        row(1, 0.0, gnb, amf, "NGAP/NAS-5GS", "UplinkNASTransport, PDU session establishment request"),
        row(2, 0.1, amf, gnb, "NGAP/NAS-5GS", "PDUSessionResourceSetupRequest"),
        row(3, 0.2, gnb, amf, "NGAP", "PDUSessionResourceSetupResponse"),
    ], verdicts)
    text = drawn.mermaid()
    _, arrows = mermaid.read(text)
    assert [a.failed for a in arrows] == [False, False, True]
    assert arrows[2].notes == tuple(verdicts[3]) and "N_1-xN_2: [3]" in text
    assert drawn.describe()["failures"] == [{"frame": 3, "cause": None, "verdicts": verdicts[3]}]


def test_a_pdu_session_diagram_takes_the_pfcp_and_sbi_frames_its_procedures_link() -> None:
    procedures = [{"procedure": "PDU Session Establishment", "n4_sbi": [
        {"interface": "SBI", "frame": 163, "response_frame": 166},
        {"interface": "N4", "frame": 165, "response_frame": None, "why": "no response seen"}]}]
    assert sequence_tool.core_frames(procedures) == [163, 166, 165]


def test_the_messages_a_view_draws_are_the_arrows_of_the_mermaid() -> None:
    drawn = sequence.build([
        row(1, 10.0, "10.0.0.5", "10.0.0.1", "NGAP", "InitialUEMessage", **{"sctp.dstport": "38412"}),
        row(2, 10.5, "10.0.0.1", "10.0.0.5", "NGAP/NAS-5GS", "DownlinkNASTransport, Registration reject",
            **{"sctp.srcport": "38412", "nas_5gs.mm.message_type": "0x44"}),
    ], {2: ["Registration reject: rule r1, TS 24.501: x"]})
    described = drawn.describe()
    arrows = [line.strip() for line in drawn.mermaid().splitlines() if "->>" in line or "-x" in line]
    drawn_again = [f"{m['from']}{'-x' if m['failed'] else '->>'}{m['to']}: {m['label']}" for m in described["messages"]]
    assert drawn_again == arrows
    assert [(m["frame"], m["time"]) for m in described["messages"]] == [(1, 10.0), (2, 10.5)]
    assert {m["from"] for m in described["messages"]} <= {p["id"] for p in described["participants"]}
