"""Captures built from real frames for pcap_stats' response-time pairing, where the corpus has no example:
a GTPv2 exchange Wireshark 4.0 does not link (Release Access Bearers), and PFCP requests quoted by ICMP
port-unreachable errors. Kept under the tree cache by recipe; the recorded sharkd answers and tshark's
are cached by the file's identity.

Each recipe step is one packet: a corpus frame (its bytes untouched, or with GTPv2 header bytes set), or
an ICMP error built around a corpus frame (IPv4 + ICMP type/code + as much of the quoted datagram as
Linux quotes, 576 bytes in all), written in order into a classic pcap with nanosecond timestamps."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from pathlib import Path

from tests.support.pcapedit import Packet, ipv4_at, packets, write_ns_pcap
from tests.support.sharkd_trees import CACHE

BASE_S = 1_700_000_000
ICMP_QUOTE = 576 - 20 - 8  # RFC 1812: the error datagram is at most 576 bytes


@dataclass(frozen=True)
class Step:
    """Packet `frame` (1-based) of the source at `at_ns`; `gtpv2`: (message type, sequence number) set in
    its GTPv2-C header; `text`: (old, new) replacements in its UDP payload; `icmp`: (type, code) of an ICMP
    error sent back to the frame's sender, quoting it."""

    frame: int
    at_ns: int
    gtpv2: tuple[int, int] | None = None
    icmp: tuple[int, int] | None = None
    text: tuple[tuple[bytes, bytes], ...] = ()  # replacements in a UDP payload (SIP), lengths set again


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _gtpv2(frame: bytearray, ip: int, message_type: int, seq: int) -> None:
    udp = ip + (frame[ip] & 0x0F) * 4
    gtp = udp + 8
    frame[gtp + 1] = message_type
    at = gtp + (8 if frame[gtp] & 0x08 else 4)  # after the TEID when the T flag is set
    frame[at:at + 3] = seq.to_bytes(3, "big")
    struct.pack_into(">H", frame, udp + 6, 0)  # no UDP checksum (the header changed)


def _udp_text(frame: bytearray, ip: int, edits: tuple[tuple[bytes, bytes], ...]) -> bytearray:
    udp = ip + (frame[ip] & 0x0F) * 4
    end = ip + struct.unpack_from(">H", frame, ip + 2)[0]
    payload = bytes(frame[udp + 8:end])
    for old, new in edits:
        assert old in payload, old
        payload = payload.replace(old, new, 1)
    out = bytearray(frame[:udp + 8]) + payload
    struct.pack_into(">H", out, ip + 2, udp + 8 + len(payload) - ip)
    struct.pack_into(">H", out, ip + 10, 0)
    struct.pack_into(">H", out, ip + 10, _checksum(bytes(out[ip:udp])))
    struct.pack_into(">HH", out, udp + 4, 8 + len(payload), 0)  # no UDP checksum (the payload changed)
    return out


def _icmp_error(frame: bytearray, ip: int, kind: tuple[int, int]) -> bytearray:
    quoted = bytes(frame[ip:ip + min(struct.unpack_from(">H", frame, ip + 2)[0], ICMP_QUOTE)])
    icmp = bytearray(struct.pack(">BBHI", kind[0], kind[1], 0, 0) + quoted)
    struct.pack_into(">H", icmp, 2, _checksum(bytes(icmp)))
    header = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0xC0, 20 + len(icmp), 0, 0, 64, 1, 0,
                                   bytes(frame[ip + 16:ip + 20]), bytes(frame[ip + 12:ip + 16])))
    struct.pack_into(">H", header, 10, _checksum(bytes(header)))
    link = frame[:ip]
    if ip == 14:  # Ethernet: back to the sender
        link = frame[6:12] + frame[0:6] + frame[12:14]
    return bytearray(link) + header + icmp


def build(name: str, source: Path, steps: list[Step]) -> Path:
    """`source`'s frames as the steps say, into CACHE/srt-<name>-<key>.pcap (built once)."""
    data = bytearray(source.read_bytes())
    key = hashlib.sha256(repr((source.name, len(data), steps)).encode()).hexdigest()[:12]
    out = CACHE / f"srt-{name}-{key}.pcap"
    if out.exists():
        return out
    found: list[Packet] = list(packets(data))
    records: list[tuple[int, bytes | bytearray]] = []
    for step in steps:
        packet = found[step.frame - 1]
        frame = bytearray(data[packet.offset:packet.offset + packet.caplen])
        ip = ipv4_at(data, packet)
        assert ip is not None, f"{source.name} frame {step.frame} is not IPv4"
        ip -= packet.offset
        if step.gtpv2 is not None:
            _gtpv2(frame, ip, *step.gtpv2)
        if step.text:
            frame = _udp_text(frame, ip, step.text)
        if step.icmp is not None:
            frame = _icmp_error(frame, ip, step.icmp)
        records.append((BASE_S * 10**9 + step.at_ns, frame))
    write_ns_pcap(out, found[0].linktype, records)
    return out


MS = 1_000_000


def release_access_bearers(source: Path) -> Path:
    """`source`: tempo_OppoMME-detach.pcap. Its GTPv2-C exchange, the two Modify Bearer pairs (and a third
    copy) made Release Access Bearers (170/171), each response with its request's sequence number: Wireshark
    4.0 links none of them."""
    return build("rab", source, [
        Step(36, 0), Step(37, 1 * MS),
        Step(43, 100 * MS, gtpv2=(170, 0x9A81)), Step(44, 101 * MS, gtpv2=(171, 0x9A81)),
        Step(51, 400 * MS, gtpv2=(170, 0x9A82)), Step(52, 401 * MS, gtpv2=(171, 0x9A82)),
        Step(43, 900 * MS, gtpv2=(170, 0x9A84)), Step(44, 902 * MS, gtpv2=(171, 0x9A84)),
        Step(68, 10_000 * MS), Step(69, 10_001 * MS)])


def pfcp_icmp(source: Path) -> Path:
    """`source`: adrian_sandbox_n4.pcap. Its PFCP with ICMP port unreachables: a Heartbeat quoted once, then
    resent and answered (frames 1-4); a Session Establishment quoted after each of its two transmissions,
    never answered (5-8); a Modification answered and its response repeated (9-11); a Modification never
    answered (12); a response without request (13); an Establishment the capture ends on (14)."""
    return build("pfcp-icmp", source, [
        Step(1, 0), Step(1, 100_000, icmp=(3, 3)), Step(1, 3000 * MS), Step(2, 3000 * MS + 100_000),
        Step(5, 5000 * MS), Step(5, 5000 * MS + 200_000, icmp=(3, 3)), Step(5, 8000 * MS),
        Step(5, 8000 * MS + 200_000, icmp=(3, 3)),
        Step(7, 10_000 * MS), Step(8, 10_000 * MS + 130_000), Step(8, 10_500 * MS),
        Step(11, 12_000 * MS), Step(16, 15_000 * MS), Step(9, 20_000 * MS)])


def sip_cancel(source: Path) -> Path:
    """`source`: heplify_fax_call_t38_sip.pcap. Its INVITE (CSeq 4) and 100 Trying, then a CANCEL answered 200
    (CSeq 4 CANCEL), the INVITE's 408 and an ACK (frames 1-6); a second INVITE (CSeq 5) with a 100 Trying
    only (7, 8); an OPTIONS answered 75 ms later (9, 10). Wireshark 4.0 links the 408 and the ACK to the
    CANCEL and the CANCEL's 200 to nothing."""
    invite, trying, ack, options, options_ok = 3124, 3125, 3143, 2680, 2689
    return build("sip-cancel", source, [
        Step(invite, 0), Step(trying, 1 * MS),
        Step(invite, 5000 * MS, text=((b"INVITE sip:", b"CANCEL sip:"), (b"CSeq:  4 INVITE", b"CSeq:  4 CANCEL"))),
        Step(trying, 5001 * MS, text=((b"100 Trying", b"200 OK"), (b"CSeq: 4 INVITE", b"CSeq: 4 CANCEL"))),
        Step(trying, 5002 * MS, text=((b"100 Trying", b"408 Request Timeout"),)),
        Step(ack, 5003 * MS),
        Step(invite, 6000 * MS, text=((b"CSeq:  4 INVITE", b"CSeq:  5 INVITE"),)),
        Step(trying, 6001 * MS, text=((b"CSeq: 4 INVITE", b"CSeq: 5 INVITE"),)),
        Step(options, 60_000 * MS), Step(options_ok, 60_075 * MS)])
