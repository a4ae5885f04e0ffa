"""The index's layer rows (actors/pcap/index/tables.py): how a frame's every-occurrence fields are
aligned with its frame.protocols, and the times kept to the nanosecond. The tables themselves are
compared with sharkd's taps on every corpus capture (tests/e2e/test_pcap_index.py); these are the
cases the corpus may not hold: a quoted packet, a layer without its fields, negative times."""

from __future__ import annotations

import re
from pathlib import Path

from diagd.actors.pcap.index.schema import COLUMNS, SCHEMA_VERSION
from diagd.actors.pcap.index.tables import LAYERED, files_holding, frame_layers, rel_ns, seconds


def cells(**given: list[str]) -> dict[str, list[str]]:
    return {c: given.get(c, []) for c in LAYERED}


def test_a_tunnelled_transport_takes_the_nearest_network_layer_below_it() -> None:
    rows, broken = frame_layers(7, "eth:ethertype:ip:udp:gtp:ip:tcp:http", cells(
        ip_src=["10.0.0.1", "12.1.1.2"], ip_dst=["10.0.0.2", "12.1.1.1"], udp_src_port=["2152"],
        udp_dst_port=["2152"], udp_stream=["0"], src_port=["40000"], dst_port=["80"], tcp_stream=["3"]), 120, 5)
    assert not broken
    assert [(r[2], r[3], r[4], r[5], r[6], r[7], r[8]) for r in rows] == [
        ("ip", "ip", "10.0.0.1", "10.0.0.2", None, None, None),
        ("udp", "ip", "10.0.0.1", "10.0.0.2", 2152, 2152, 0),
        ("ip", "ip", "12.1.1.2", "12.1.1.1", None, None, None),
        ("tcp", "ip", "12.1.1.2", "12.1.1.1", 40000, 80, 3)]
    assert {r[1] for r in rows} == {2, 3, 5, 6} and {(r[0], r[9], r[10]) for r in rows} == {(7, 120, 5)}


def test_what_an_icmp_error_quotes_is_read_but_not_counted() -> None:
    rows, broken = frame_layers(3, "eth:ethertype:ip:icmp:ip:udp:dns", cells(
        ip_src=["10.0.2.3", "10.0.2.15"], ip_dst=["10.0.2.15", "10.0.2.3"], udp_src_port=["5353"],
        udp_dst_port=["53"], udp_stream=["1"]), 100, 0)
    assert not broken and [(r[2], r[4]) for r in rows] == [("ip", "10.0.2.3")]


def test_a_layer_without_its_fields_makes_the_frame_unaligned_for_it_and_what_rests_on_it() -> None:
    # A TCP layer whose stream index is missing (a bogus header): which occurrence lacks it is unknown.
    _, broken = frame_layers(1, "eth:ethertype:ip:tcp:ip:tcp", cells(
        ip_src=["a", "b"], ip_dst=["c", "d"], src_port=["1", "2"], dst_port=["3", "4"], tcp_stream=["0"]), 60, 0)
    assert broken == {"tcp"}
    # A network layer without its addresses: every transport above rests on it.
    _, broken = frame_layers(1, "eth:ethertype:ip:udp", cells(udp_src_port=["1"], udp_dst_port=["2"],
                                                              udp_stream=["0"]), 60, 0)
    assert broken == {"ip", "udp", "tcp", "sctp"}
    # More occurrences than layers (a field some other dissector adds) is no alignment either.
    _, broken = frame_layers(1, "eth:ethertype:ip", cells(ip_src=["a", "b"], ip_dst=["c", "d"]), 60, 0)
    assert "ip" in broken


def test_times_are_kept_to_the_nanosecond_and_read_back_as_sharkd_prints_them() -> None:
    assert rel_ns("0.000000") == 0 and rel_ns("12.123456") == 12_123_456_000
    assert rel_ns("1.123456789") == 1_123_456_789 and rel_ns("-0.5") == -500_000_000
    assert seconds(1_492_930_000) == 1.49293 and seconds(-500_000_000) == -0.5
    assert seconds(86_336_434_208) == float("86.336434208")


def test_the_documented_frames_schema_is_the_one_built() -> None:
    """docs/pcap-index.md's table of the frames (frames/*.parquet) is what users read: it cannot drift."""
    doc = (Path(__file__).parents[3] / "docs" / "pcap-index.md").read_text()
    assert f"## The Parquet schema (version {SCHEMA_VERSION})" in doc
    rows = re.findall(r"^\| `(\w+)` \| ([\w<>]+) \| `([^`]+)` \| (.+) \|$", doc, re.M)
    assert rows == [(c.name, c.parquet_type, c.field, c.about) for c in COLUMNS]


ALL = {"ip", "ipv6", "udp", "tcp", "sctp"}


def test_frames_whose_taps_the_fields_do_not_tell_are_left_to_sharkd() -> None:
    """Where a dissector adds a layer's fields and then does not queue its tap as they say (found by a
    review against sharkd's taps on built frames), the frame is unaligned, never counted wrongly."""
    udp = cells(ip_src=["10.0.0.1"], ip_dst=["10.0.0.2"], udp_src_port=["1"], udp_dst_port=["2"], udp_stream=["0"])
    # A bogus TCP/UDP header (an Error in the last layer, a transport): the tap never ran.
    assert frame_layers(1, "eth:ethertype:ip:udp", udp, 60, 0, [8388608])[1] == ALL
    # An Error in an application layer above the transport: the transport's tap ran before it.
    assert frame_layers(1, "eth:ethertype:ip:udp:sip", udp, 60, 0, [8388608])[1] == set()
    # No time (a Simple Packet Block), a routing header, a packet quoted by PPP LCP, an ICMP echo and
    # then a second packet in one frame (an A-MSDU): not read off the fields.
    assert frame_layers(1, "eth:ethertype:ip:udp", udp, 60, None)[1] == ALL
    assert frame_layers(1, "eth:ethertype:ipv6:ipv6.routing:udp", udp, 60, 0)[1] == ALL
    assert frame_layers(1, "ppp:lcp:ip:udp", udp, 60, 0)[1] == ALL
    twice = cells(ip_src=["a", "10.0.0.1"], ip_dst=["b", "10.0.0.2"], udp_src_port=["1"], udp_dst_port=["2"],
                  udp_stream=["0"])
    assert frame_layers(1, "wlan:llc:ip:icmp:data:llc:ip:udp", twice, 60, 0)[1] == ALL
    # SCTP queues its tap after its chunks: an error in them, or no chunk, and it is not counted.
    sctp = cells(ip_src=["a"], ip_dst=["b"], sctp_src_port=["38412"], sctp_dst_port=["38412"],
                 sctp_chunk_types=["0"])
    assert frame_layers(1, "eth:ethertype:ip:sctp:ngap", sctp, 60, 0, [8388608])[1] == {"sctp"}
    assert frame_layers(1, "eth:ethertype:ip:sctp", {**sctp, "sctp_chunk_types": []}, 60, 0)[1] == {"sctp"}
    assert frame_layers(1, "eth:ethertype:ip:sctp", sctp, 60, 0)[1] == set()


def test_a_range_of_frame_numbers_opens_only_the_files_holding_it() -> None:
    files = [Path(f"{first:012d}.parquet") for first in (1, 501, 1001)]  # frames 1-500, 501-1000, 1001-...
    assert files_holding(files, 1, 10) == files[:1] and files_holding(files, 500, 501) == files[:2]
    assert files_holding(files, 600, 700) == files[1:2] and files_holding(files, 1001, 5000) == files[2:]
    assert files_holding(files, 1, 10**9) == files and files_holding(files[:1], 7, 7) == files[:1]
