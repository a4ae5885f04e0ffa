"""Captures built from a corpus capture's real NGAP frames (Ethernet, IPv4, SCTP) for what the corpus lacks:
frames whose dissection depends on frames without the SCTP layer. A cut of the capture (index/narrow.py)
must keep those too, or say it cannot answer.

- ip_fragments: every IPv4 packet over 120 bytes sent as two fragments (the first holds no SCTP layer);
- wlan_fragments: the capture re-framed as 802.11 data (linktype 105), led by an SCTP association of its
  own whose every frame is sent as two 802.11 fragments (the first holds no IP header): lost from a cut,
  it would renumber the associations after it.
"""

from __future__ import annotations

import struct
from pathlib import Path

ETHERTYPE_IPV4 = 0x0800
LLC_IPV4 = bytes.fromhex("aaaa030000000800")  # 802.2 LLC/SNAP, IPv4


def read_pcap(path: Path) -> tuple[int, list[tuple[int, int, bytes]]]:
    """(linktype, [(seconds, microseconds, frame)]) of a little-endian microsecond pcap."""
    data = path.read_bytes()
    assert data[:4] == b"\xd4\xc3\xb2\xa1", f"{path.name}: not a little-endian microsecond pcap"
    linktype = struct.unpack_from("<I", data, 20)[0]
    at, records = 24, []
    while at + 16 <= len(data):
        seconds, micros, captured, _ = struct.unpack_from("<IIII", data, at)
        records.append((seconds, micros, data[at + 16:at + 16 + captured]))
        at += 16 + captured
    return linktype, records


def write_pcap(path: Path, linktype: int, records: list[tuple[int, int, bytes]]) -> Path:
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype)]
    out += [struct.pack("<IIII", s, us, len(f), len(f)) + f for s, us, f in records]
    path.write_bytes(b"".join(out))
    return path


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _with_header(ip: bytes, ident: int, flags_offset: int, payload: bytes) -> bytes:
    header = bytearray(ip[:20])
    struct.pack_into("!HHH", header, 2, 20 + len(payload), ident, flags_offset)
    struct.pack_into("!H", header, 10, 0)
    struct.pack_into("!H", header, 10, _checksum(bytes(header)))
    return bytes(header) + payload


def ip_fragments(source: Path, out: Path) -> Path:
    linktype, records = read_pcap(source)
    assert linktype == 1, "an Ethernet capture"
    built = []
    for ident, (seconds, micros, frame) in enumerate(records, start=1):
        ip = frame[14:]
        if struct.unpack_from("!H", frame, 12)[0] != ETHERTYPE_IPV4 or ip[0] != 0x45 or len(ip) <= 120:
            built.append((seconds, micros, frame))
            continue
        payload = ip[20:struct.unpack_from("!H", ip, 2)[0]]
        built.append((seconds, micros, frame[:14] + _with_header(ip, ident, 0x2000, payload[:64])))  # MF
        built.append((seconds, micros + 1, frame[:14] + _with_header(ip, ident, 64 // 8, payload[64:])))
    return write_pcap(out, 1, built)


def _wlan(body: bytes, sequence: int, fragment: int, more: bool) -> bytes:
    control = bytes([0x08, 0x01 | (0x04 if more else 0)])  # data, to the distribution system
    addresses = bytes.fromhex("020000000002" "020000000001" "020000000003")
    return control + b"\0\0" + addresses + struct.pack("<H", sequence << 4 | fragment) + body


def wlan_fragments(source: Path, out: Path) -> Path:
    linktype, records = read_pcap(source)
    assert linktype == 1, "an Ethernet capture"
    first_s = records[0][0] - 1
    built, sequence = [], 0
    for k, (_, _, frame) in enumerate(records[:4]):  # the association's setup, between other ends
        ip = bytearray(frame[14:])
        forward = k % 2 == 0
        ip[12:16], ip[16:20] = (bytes([10, 99, 0, 1]), bytes([10, 99, 0, 2]))[:: 1 if forward else -1]
        struct.pack_into("!HH", ip, 20, *((5000, 38412) if forward else (38412, 5000)))
        body = LLC_IPV4 + _with_header(bytes(ip), 0, 0, bytes(ip[20:]))
        sequence += 1
        half = len(body) // 2
        built.append((first_s, 2 * k, _wlan(body[:half], sequence, 0, True)))
        built.append((first_s, 2 * k + 1, _wlan(body[half:], sequence, 1, False)))
    for seconds, micros, frame in records:
        sequence = (sequence + 1) % 4096
        built.append((seconds, micros, _wlan(LLC_IPV4 + frame[14:], sequence, 0, False)))
    return write_pcap(out, 105, built)
