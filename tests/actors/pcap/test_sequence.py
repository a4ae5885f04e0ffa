"""sequence.py on hand-written rows: escaping, roles from protocol evidence, failure arrows, gap notes."""

from __future__ import annotations

from typing import Any

from diagd.actors.pcap import sequence
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
