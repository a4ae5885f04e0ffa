"""Display filters the index answers (actors/pcap/index/filters.py): what is translated, what is left to
sharkd, and Wireshark 4.0's meaning of each on fields of many occurrences and on absent ones. Every
translated filter is also compared with `tshark -Y` on every corpus capture (tests/e2e/test_pcap_index.py)."""

from __future__ import annotations

import duckdb
import pytest

from diagd.actors.pcap.index.filters import to_sql

# Frames: 1 a GTP-U packet (outer and inner IPv4, two UDP layers), 2 plain TCP, 3 no IP at all.
ROWS = """
SELECT * FROM (VALUES
 (1, 'eth:ethertype:ip:udp:gtp:ip:udp:dns', ['10.0.0.1', '12.1.1.2'], ['10.0.0.2', '12.1.1.1'], [2152, 5353],
  [2152, 53], NULL::BIGINT[], NULL::BIGINT[], 100),
 (2, 'eth:ethertype:ip:tcp', ['10.0.0.1'], ['10.0.0.3'], NULL, NULL, [40000], [80], 60),
 (3, 'eth:arp', NULL, NULL, NULL, NULL, NULL, NULL, 42))
AS t(number, protocols, ip_src, ip_dst, udp_src_port, udp_dst_port, src_port, dst_port, length)"""


def matching(display_filter: str) -> list[int]:
    sql = to_sql(display_filter)
    assert sql is not None, display_filter
    return [n for (n,) in duckdb.connect().execute(f"SELECT number FROM ({ROWS}) WHERE {sql} ORDER BY number")
            .fetchall()]


@pytest.mark.parametrize(("display_filter", "frames"), [
    ("", [1, 2, 3]), ("frame", [1, 2, 3]), ("udp", [1]), ("!udp", [2, 3]), ("arp || tcp", [2, 3]),
    # == is "any occurrence": the inner packet's port counts.
    ("udp.port == 53", [1]), ("ip.addr == 12.1.1.1", [1]), ("ip.src == 10.0.0.1", [1, 2]),
    # != is "every occurrence differs", and false on a frame without the field (frame 3), even under !.
    ("udp.port != 53", []), ("udp.port != 80", [1]), ("ip.src != 12.1.1.2", [2]),
    ("!(ip.src == 12.1.1.2)", [2, 3]), ("!(ip.src != 12.1.1.2)", [1, 3]),
    ("tcp.port in {80, 443}", [2]), ("udp.srcport > 3000", [1]), ("frame.len <= 60", [2, 3]),
    ("ip.src", [1, 2]), ("tcp.dstport eq 80 and not udp", [2]), ("(udp or tcp) && frame.number ge 2", [2]),
    ("tcp.port == 0x50", [2]),
])
def test_what_is_translated_means_what_wireshark_means(display_filter: str, frames: list[int]) -> None:
    assert matching(display_filter) == frames


@pytest.mark.parametrize("display_filter", [
    "http", "gtp", "tcp.stream in {1 2 3}", "ip.addr == 10.0.0.0/8", "ip.addr == example.com",
    'frame contains "a"', "ip.src[0:2] == 0a:00", "tcp.port == 80 || ", "((udp)", "udp.port === 53",
    "udp.port ~ 53", "len(ip.src) == 4", "ip.addr == 10.0.0.256", "tcp.port in {}", "udp.port == 1..5",
])
def test_what_it_cannot_answer_as_wireshark_would_goes_to_sharkd(display_filter: str) -> None:
    assert to_sql(display_filter) is None
