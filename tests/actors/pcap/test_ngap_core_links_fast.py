"""The N4 / SBI messages of a PDU session establishment (actors/pcap/ngap/core_links.py) on rows written here.

The rows are what `tshark -T fields -E occurrence=a -E aggregator=,` prints for CORE_FIELDS (empty string: no
value; several values joined by commas). What must come out is the module's documented behaviour, written out
again here: PFCP Session Establishment Requests (PFCP message type 50, TS 29.244 table 7.3-1) with the cause of
their response (type 51); Nsmf_PDUSession CreateSMContext (TS 29.502: POST .../sm-contexts) and
Namf_Communication N1N2MessageTransfer (TS 29.518: POST .../ue-contexts/{ueContextId}/n1-n2-messages) and, in
home-routed roaming, the V-SMF's Nsmf_PDUSession Create at the H-SMF (TS 29.502: POST .../pdu-sessions) over
HTTP/2 (answered on the same TCP stream and stream id, later; the JSON of DATA frames of that stream alone) or
HTTP/1.1 (http.response_in); each linked to one establishment by the strongest evidence: UE IPv4 (PFCP PDI, or
the answer's JSON ueIpv4Address) = the NAS accept's PDU address, SUPI (path, or the request JSON's `supi`, with
its `pduSessionId`) = the UE's null-scheme SUCI inside its window, else the only establishment whose window
(first to last frame) holds the request.
"""

from __future__ import annotations

import pytest

from diagd.actors.pcap.ngap.core_links import CORE_FIELDS, CoreMessage, Establishment, attach, core_messages

T = 1_700_000_000.0
SMF = "/nsmf-pdusession/v1/sm-contexts"
N1N2 = "/namf-comm/v1/ue-contexts/imsi-001010000000001/n1-n2-messages"
BY_IP = "UE IPv4 10.45.0.2 in the PFCP PDI = PDU address in the NAS accept"
BY_SUPI = "SUPI imsi-001010000000001 in the path = the UE's SUCI (null scheme), in its time window"
BY_WINDOW = "timing window: the only PDU session establishment in progress"


def row(frame: int, time: float, **values: str) -> dict[str, str]:
    """A tshark row: every CORE_FIELDS column, empty unless given (dots written as underscores)."""
    got = {name: values.pop(name.replace(".", "_"), "") for name in CORE_FIELDS}
    assert not values, f"not a CORE_FIELDS column: {values}"
    return {**got, "frame.number": str(frame), "frame.time_epoch": f"{time:.6f}"}


def test_pfcp_session_establishment_requests_with_their_response_s_cause() -> None:
    rows = [row(1, T, pfcp_msg_type="50", pfcp_seqno="7", pfcp_ue_ip_addr_ipv4="10.45.0.2", pfcp_response_in="2"),
            row(2, T + 0.0125, pfcp_msg_type="51", pfcp_seqno="7", pfcp_cause="1,64"),
            row(3, T + 1, pfcp_msg_type="50", pfcp_ue_ip_addr_ipv4="10.45.0.3,10.45.0.4"),  # no response
            row(4, T + 2, pfcp_msg_type="51", pfcp_cause="64")]  # a response alone is no request
    got = core_messages(rows)
    assert got == [CoreMessage("N4", "PFCP Session Establishment Request", 1, T, 2, T + 0.0125, "cause 1", "10.45.0.2"),
                   CoreMessage("N4", "PFCP Session Establishment Request", 3, T + 1, ue_ipv4="10.45.0.3")]
    assert got[0].describe("x") == {"interface": "N4", "message": "PFCP Session Establishment Request", "frame": 1,
                                    "time": T, "response_frame": 2, "latency_ms": 12.5, "result": "cause 1",
                                    "linked_by": "x"}
    assert got[1].describe("y") == {"interface": "N4", "message": "PFCP Session Establishment Request", "frame": 3,
                                    "time": T + 1, "response_frame": None, "latency_ms": None, "result": None,
                                    "linked_by": "y", "why": "no response seen"}


def test_http2_sbi_calls_are_answered_on_their_stream_later() -> None:
    rows = [
        # An answer on stream 1 of TCP stream 3 *before* the request: not its answer.
        row(9, T - 1, tcp_stream="3", http2_streamid="1", http2_headers_status="204"),
        row(10, T, tcp_stream="3", http2_streamid="1", http2_headers_method="POST", http2_headers_path=SMF),
        row(11, T + 0.001, tcp_stream="4", http2_streamid="1", http2_headers_status="500"),  # another TCP stream
        row(12, T + 0.002, tcp_stream="3", http2_streamid="5,1", http2_headers_status="201,201"),  # two answers
        row(13, T + 0.003, tcp_stream="3", http2_streamid="1", http2_headers_status="404"),  # a later one
        # User-plane HTTP inside GTP-U is no SBI call, and the rows after it are still read.
        row(14, T + 0.4, tcp_stream="3", http2_streamid="13", http2_headers_method="POST", http2_headers_path=SMF,
            gtp_teid="0x00000001"),
        # N1N2 with its SUPI; :method lost by HPACK (no method): kept; no answer.
        row(15, T + 0.5, tcp_stream="3", http2_streamid="7", http2_headers_path=N1N2),
        row(16, T + 0.55, tcp_stream="3", http2_streamid="7"),  # a later HEADERS frame without :status: no answer
        # Not SBI calls of a PDU session: a GET, another service, user-plane HTTP inside GTP-U.
        row(17, T + 0.6, tcp_stream="3", http2_streamid="9", http2_headers_method="GET", http2_headers_path=SMF),
        row(18, T + 0.7, tcp_stream="3", http2_streamid="11", http2_headers_method="POST",
            http2_headers_path="/nudm-sdm/v2/imsi-001010000000001/sm-data"),
        row(19, T + 0.9, tcp_stream="3", http2_streamid="15", http2_headers_method="POST",
            http2_headers_path="/nsmf-pdusession/v1/sm-contexts/1/modify"),
    ]
    assert core_messages(rows) == [
        CoreMessage("SBI", "Nsmf_PDUSession CreateSMContext", 10, T, 12, T + 0.002, "HTTP 201"),
        CoreMessage("SBI", "Namf_Communication N1N2MessageTransfer", 15, T + 0.5, supi="imsi-001010000000001")]


def test_http1_sbi_calls_are_answered_by_their_response_in() -> None:
    rows = [row(20, T, http_request_method="POST", http_request_uri=N1N2, http_response_in="22"),
            row(21, T + 0.001, http_response_code="500"),
            row(22, T + 0.004, http_response_code="200,100"),
            row(23, T + 1, http_request_method="POST", http_request_uri=SMF, http_response_in="99"),  # not captured
            row(24, T + 2, http_request_method="GET", http_request_uri=SMF)]  # reads, creates nothing
    got = core_messages(rows)
    assert got == [CoreMessage("SBI", "Namf_Communication N1N2MessageTransfer", 20, T, 22, T + 0.004, "HTTP 200",
                               supi="imsi-001010000000001"),
                   CoreMessage("SBI", "Nsmf_PDUSession CreateSMContext", 23, T + 1)]
    assert got[0].describe("z")["latency_ms"] == 4.0
    # Times to the µs, as capture times go (a nanosecond capture's extra digits dropped).
    assert message(1, T + 0.1234567).describe("w")["time"] == T + 0.123457
    assert message(1, T + 0.25).describe("w")["time"] == T + 0.25


def message(frame: int, time: float, ue_ipv4: str | None = None, supi: str | None = None) -> CoreMessage:
    return CoreMessage("N4" if ue_ipv4 else "SBI", "m", frame, time, ue_ipv4=ue_ipv4, supi=supi)


def est(start: float, end: float, ue_ipv4: str | None = None, supi: bool = False, psi: int | None = None
        ) -> Establishment:
    return Establishment(start, end, ue_ipv4, ("001", "01", "0000000001") if supi else None, psi=psi)


def linked(e: Establishment) -> list[tuple[int, str]]:
    return [(m["frame"], m["linked_by"]) for m in e.attached]


def test_the_ue_address_links_first_wherever_the_request_falls() -> None:
    a, b = est(T, T + 1, "10.45.0.2"), est(T + 0.5, T + 2, "10.45.0.3")
    # Outside both windows, inside both, inside the other's only: the address decides.
    msgs = [message(1, T + 5, "10.45.0.2"), message(2, T + 0.7, "10.45.0.2"), message(3, T + 1.5, "10.45.0.2")]
    assert attach([a, b], msgs) == {"n4_sbi_messages": 3, "unattached": 0}
    assert linked(a) == [(1, BY_IP), (2, BY_IP), (3, BY_IP)] and linked(b) == []


def test_the_address_is_stronger_evidence_than_the_supi() -> None:
    a, b = est(T, T + 1, "10.45.0.2"), est(T, T + 1, supi=True)
    assert attach([a, b], [message(1, T + 0.5, "10.45.0.2", supi="imsi-001010000000001")])["unattached"] == 0
    assert linked(a) == [(1, BY_IP)] and linked(b) == []


def test_an_address_two_establishments_share_falls_back_to_the_window() -> None:
    a, b = est(T, T + 1, "10.45.0.2"), est(T + 2, T + 3, "10.45.0.2")
    msgs = [message(1, T + 0.5, "10.45.0.2"), message(2, T + 1.5, "10.45.0.2"), message(3, T + 2, "10.45.0.9")]
    assert attach([a, b], msgs) == {"n4_sbi_messages": 3, "unattached": 1}
    assert linked(a) == [(1, BY_WINDOW)] and linked(b) == [(3, BY_WINDOW)]


@pytest.mark.parametrize(("offset", "to_a"), [(-0.001, False), (0.0, True), (0.5, True), (1.0, True), (1.001, False)])
def test_the_supi_links_inside_the_window_only(offset: float, to_a: bool) -> None:
    """Two establishments overlap (the window alone cannot tell); only `a` is the SUPI's UE. Windows are closed
    intervals: a request at the first or the last frame's time is inside. Just outside `a`'s window the SUPI
    does not count, and `b`'s is the only window left holding the request."""
    a, b = est(T, T + 1, supi=True), est(T - 1, T + 2)
    assert attach([a, b], [message(1, T + offset, supi="imsi-001010000000001")]) == {
        "n4_sbi_messages": 1, "unattached": 0}
    assert linked(a) == ([(1, BY_SUPI)] if to_a else []) and linked(b) == ([] if to_a else [(1, BY_WINDOW)])


def test_another_supi_or_no_evidence_leaves_a_request_in_two_windows_unattached() -> None:
    a, b = est(T, T + 1, supi=True), est(T, T + 1, supi=True)
    assert attach([a, b], [message(1, T + 0.5, supi="imsi-001010000000001")])["unattached"] == 1  # both match
    a, b = est(T, T + 1, supi=True), est(T - 1, T + 2)
    assert attach([a, b], [message(2, T + 0.5, supi="imsi-001010000000002"), message(3, T + 0.5)]) == {
        "n4_sbi_messages": 2, "unattached": 2}
    assert linked(a) == linked(b) == []


@pytest.mark.parametrize(("offset", "linked_to_a"), [(-0.001, False), (0.0, True), (1.0, True), (1.001, False)])
def test_the_window_is_first_to_last_frame_inclusive(offset: float, linked_to_a: bool) -> None:
    a = est(T, T + 1)
    assert attach([a], [message(1, T + offset)]) == {"n4_sbi_messages": 1, "unattached": 0 if linked_to_a else 1}
    assert linked(a) == ([(1, BY_WINDOW)] if linked_to_a else [])


def test_no_establishment_leaves_everything_unattached() -> None:
    assert attach([], [message(1, T, "10.45.0.2"), message(2, T, supi="imsi-001010000000001")]) == {
        "n4_sbi_messages": 2, "unattached": 2}
    assert attach([est(T, T + 1)], []) == {"n4_sbi_messages": 0, "unattached": 0}


CREATE = "/nsmf-pdusession/v1/pdu-sessions"
# PduSessionCreateData (TS 29.502 6.1.6.2.9) as json.path_with_value lists it: top-level members only count.
CREATE_DATA = "/supi:imsi-001010000000001,/pei:imeisv-1,/pduSessionId:5,/dnn:internet,/sNssai/sst:1,/vsmf/supi:imsi-9"


def test_a_v_smf_create_at_the_h_smf_is_an_sbi_call_with_what_its_json_names() -> None:
    """Home-routed roaming: the V-SMF's POST .../pdu-sessions, its JSON (a DATA frame of its stream) naming the SUPI
    and PDU session id, the H-SMF's answer naming the UE's address (PduSessionCreatedData.ueIpv4Address)."""
    rows = [  # the request's HEADERS after a SETTINGS ACK and DATA of stream 1, in one segment
        row(30, T, tcp_stream="7", http2_streamid="0,1,3", http2_type="4,0,1", http2_headers_method="POST",
            http2_headers_path=CREATE),
        row(31, T + 0.001, tcp_stream="7", http2_streamid="0,3", json_path_with_value=CREATE_DATA),  # + WINDOW_UPDATE
        row(32, T + 0.002, tcp_stream="7", http2_streamid="5", json_path_with_value="/supi:imsi-001010000000009"),
        # DATA of two streams in one frame: its JSON is neither's for sure
        row(33, T + 0.003, tcp_stream="7", http2_streamid="3,5", json_path_with_value="/pduSessionId:9"),
        row(34, T + 0.02, tcp_stream="7", http2_streamid="3", http2_headers_status="201"),
        row(35, T + 0.021, tcp_stream="7", http2_streamid="3",
            json_path_with_value="/pduType:IPV4,/hcnTunnelInfo/ipv4Addr:10.0.0.1,/ueIpv4Address:10.45.0.7"),
        # The same call over HTTP/1.1, its JSON in the request's and the response's own frames
        row(40, T + 1, http_request_method="POST", http_request_uri=CREATE, http_response_in="41",
            json_path_with_value="/pduSessionId:x,/supi:nai-a@b"),  # no imsi SUPI, no number: neither counts
        row(41, T + 1.01, http_response_code="201", json_path_with_value="/ueIpv4Address:10.45.0.8"),
        # A JSON before the request on its stream is not its body
        row(50, T + 2, tcp_stream="8", http2_streamid="1", json_path_with_value="/supi:imsi-001010000000001"),
        row(51, T + 2.1, tcp_stream="8", http2_streamid="1", http2_headers_method="POST", http2_headers_path=SMF),
        # Without http2.type the first stream but 0 is the request's (a SETTINGS ACK before its HEADERS)
        row(52, T + 3, tcp_stream="9", http2_streamid="0,5,5", http2_headers_method="POST", http2_headers_path=SMF),
        row(53, T + 3.01, tcp_stream="9", http2_streamid="5", http2_headers_status="201"),
    ]
    assert core_messages(rows) == [
        CoreMessage("SBI", "Nsmf_PDUSession Create", 30, T, 34, T + 0.02, "HTTP 201", ue_ipv4="10.45.0.7",
                    supi="imsi-001010000000001", supi_in="body", psi=5),
        CoreMessage("SBI", "Nsmf_PDUSession Create", 40, T + 1, 41, T + 1.01, "HTTP 201", ue_ipv4="10.45.0.8"),
        CoreMessage("SBI", "Nsmf_PDUSession CreateSMContext", 51, T + 2.1),
        CoreMessage("SBI", "Nsmf_PDUSession CreateSMContext", 52, T + 3, 53, T + 3.01, "HTTP 201")]


def create(frame: int, time: float, *, ue_ipv4: str | None = None, supi: str | None = None, supi_in: str = "path",
           psi: int | None = None) -> CoreMessage:
    return CoreMessage("SBI", "Nsmf_PDUSession Create", frame, time, ue_ipv4=ue_ipv4, supi=supi, supi_in=supi_in,
                       psi=psi)


def test_the_json_s_supi_and_pdu_session_id_pick_the_establishment() -> None:
    """One UE with two establishments under way at once: its SUPI fits both, the PDU session id one."""
    a, b = est(T, T + 1, supi=True, psi=1), est(T, T + 1, supi=True, psi=5)
    assert attach([a, b], [create(1, T + 0.5, supi="imsi-001010000000001", supi_in="body", psi=5)]) == {
        "n4_sbi_messages": 1, "unattached": 0}
    assert linked(a) == [] and linked(b) == [(1, "SUPI imsi-001010000000001 and PDU session id 5 in the body = the "
                                                 "UE's SUCI (null scheme) and its session, in its time window")]
    # Without a PDU session id the SUPI fits both: unattached; an establishment whose id is unknown still fits.
    a, b = est(T, T + 1, supi=True, psi=1), est(T, T + 1, supi=True, psi=5)
    assert attach([a, b], [create(2, T + 0.5, supi="imsi-001010000000001", supi_in="body")])["unattached"] == 1
    a, b = est(T, T + 1, supi=True), est(T - 1, T + 2)
    assert attach([a, b], [create(3, T + 0.5, supi="imsi-001010000000001", supi_in="body", psi=7)])["unattached"] == 0
    assert linked(a) == [(3, "SUPI imsi-001010000000001 and PDU session id 7 in the body = the UE's SUCI (null "
                             "scheme) and its session, in its time window")]


def test_the_h_smf_s_ue_address_links_a_create_wherever_it_falls() -> None:
    a, b = est(T, T + 1, "10.45.0.7"), est(T, T + 1, "10.45.0.8", supi=True, psi=1)
    assert attach([a, b], [create(1, T + 5, ue_ipv4="10.45.0.8", supi="imsi-001010000000001", psi=2)]) == {
        "n4_sbi_messages": 1, "unattached": 0}
    assert linked(a) == [] and linked(b) == [
        (1, "UE IPv4 10.45.0.8 in the answer's ueIpv4Address = PDU address in the NAS accept")]
