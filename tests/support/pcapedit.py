"""Byte-level edits of real captures, for building bigger or rarer inputs from the shared corpus.

Used by tests and by bench/pcap.py. editcap/mergecap shift and merge but cannot rewrite addresses,
ports or SCTP verification tags, and tcprewrite is not installed; so these functions edit the
packet bytes in place and leave every other byte as it was. Only Ethernet (VLAN tags allowed) /
IPv4 / SCTP packets are touched (and by remap_tcp_ports Ethernet / IPv4 / TCP ones).

Why SCTP needs retagging: merged copies of one capture repeat the same SCTP associations with the
same TSNs, so Wireshark marks every copy after the first "Retransmitted TSN" and never dissects
the payload (NGAP, Diameter, S1AP). A per-copy verification tag makes each copy its own
association. The SCTP CRC32c is not recomputed: Wireshark does not check it by default
(sctp.checksum: None) and the corpus captures carry offloaded zero checksums anyway.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

LINKTYPE_ETHERNET = 1
PCAP_MAGICS = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",  # microsecond timestamps
               b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}  # nanosecond timestamps


@dataclass
class Packet:
    """One captured packet inside the file's bytes: `data[offset:offset + caplen]`."""

    linktype: int
    offset: int
    caplen: int
    header: int  # offset of the record header (pcap) / block (pcapng)


def packets(data: bytearray) -> Iterator[Packet]:
    """Every packet of a pcap or pcapng file, in file order."""
    if bytes(data[:4]) in PCAP_MAGICS:
        endian = PCAP_MAGICS[bytes(data[:4])]
        linktype = struct.unpack_from(endian + "I", data, 20)[0] & 0x0FFFFFFF
        pos = 24
        while pos + 16 <= len(data):
            caplen = struct.unpack_from(endian + "I", data, pos + 8)[0]
            if pos + 16 + caplen > len(data):
                raise ValueError(f"pcap record at offset {pos} runs past the end of the file")
            yield Packet(linktype, pos + 16, caplen, pos)
            pos += 16 + caplen
        return
    pos, endian = 0, "<"
    linktypes: list[int] = []
    while pos + 12 <= len(data):
        block_type = struct.unpack_from(endian + "I", data, pos)[0]
        if block_type == 0x0A0D0D0A:  # section header: its byte-order magic sets the endianness
            endian = "<" if data[pos + 8:pos + 12] == b"\x4d\x3c\x2b\x1a" else ">"
            linktypes = []
        block_len = struct.unpack_from(endian + "I", data, pos + 4)[0]
        if block_len < 12:
            raise ValueError(f"bad pcapng block at offset {pos}")
        if block_type == 1:  # interface description
            linktypes.append(struct.unpack_from(endian + "H", data, pos + 8)[0])
        elif block_type == 6:  # enhanced packet
            iface, _, _, caplen = struct.unpack_from(endian + "IIII", data, pos + 8)
            yield Packet(linktypes[iface], pos + 28, caplen, pos)
        pos += block_len


@dataclass
class SctpPacket:
    """Offsets (absolute, into the file's bytes) of the IPv4 and SCTP headers of one packet."""

    ip: int
    sctp: int
    end: int  # end of the captured bytes


def sctp_in(data: bytearray, packet: Packet) -> SctpPacket | None:
    if packet.linktype != LINKTYPE_ETHERNET or packet.caplen < 14:
        return None
    pkt, caplen = packet.offset, packet.caplen
    off = 12
    ethertype = struct.unpack_from(">H", data, pkt + off)[0]
    while ethertype in (0x8100, 0x88A8) and caplen >= off + 6:
        off += 4
        ethertype = struct.unpack_from(">H", data, pkt + off)[0]
    ip = off + 2
    if ethertype != 0x0800 or caplen < ip + 20 or data[pkt + ip + 9] != 132:
        return None
    sctp = ip + (data[pkt + ip] & 0x0F) * 4
    if caplen < sctp + 12:
        return None
    return SctpPacket(pkt + ip, pkt + sctp, pkt + caplen)


def _ipv4_checksum(data: bytearray, ip: int) -> None:
    length = (data[ip] & 0x0F) * 4
    struct.pack_into(">H", data, ip + 10, 0)
    total = sum(struct.unpack_from(f">{length // 2}H", data, ip))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    struct.pack_into(">H", data, ip + 10, ~total & 0xFFFF)


def edit_sctp(data: bytearray, edit: Callable[[bytearray, SctpPacket], None]) -> int:
    """Apply `edit` to every Ethernet/IPv4/SCTP packet of a pcap or pcapng file; returns how many."""
    changed = 0
    for packet in list(packets(data)):
        found = sctp_in(data, packet)
        if found is not None:
            edit(data, found)
            changed += 1
    return changed


def retag_sctp(src: Path, dst: Path, salt: int) -> int:
    """Copy a capture, XORing the SCTP verification tag of every Ethernet/IPv4/SCTP packet."""
    data = bytearray(src.read_bytes())

    def xor(buf: bytearray, p: SctpPacket) -> None:
        vtag = struct.unpack_from(">I", buf, p.sctp + 4)[0]
        struct.pack_into(">I", buf, p.sctp + 4, vtag ^ salt)

    changed = edit_sctp(data, xor) if salt else 0
    dst.write_bytes(bytes(data))
    return changed


def readdress_sctp(data: bytearray, *, salt: int, addresses: dict[str, str], ports: dict[int, int]) -> int:
    """In place: XOR each SCTP verification tag with `salt`, map IPv4 addresses and SCTP ports.

    The IPv4 header checksum is recomputed (an address changed); see the module docstring for the
    SCTP checksum.
    """
    raw = {bytes(int(x) for x in k.split(".")): bytes(int(x) for x in v.split(".")) for k, v in addresses.items()}

    def edit(buf: bytearray, p: SctpPacket) -> None:
        for field in (p.ip + 12, p.ip + 16):
            new = raw.get(bytes(buf[field:field + 4]))
            if new is not None:
                buf[field:field + 4] = new
        _ipv4_checksum(buf, p.ip)
        for field in (p.sctp, p.sctp + 2):
            port = struct.unpack_from(">H", buf, field)[0]
            struct.pack_into(">H", buf, field, ports.get(port, port))
        vtag = struct.unpack_from(">I", buf, p.sctp + 4)[0]
        struct.pack_into(">I", buf, p.sctp + 4, vtag ^ salt)

    return edit_sctp(data, edit)


def remap_tcp_ports(data: bytearray, ports: dict[int, int]) -> int:
    """In place: map the TCP ports of every Ethernet/IPv4/TCP packet (`ports`: old -> new); returns
    how many packets changed. The TCP checksum is left as it was (Wireshark does not check it by
    default: tcp.check_checksum FALSE), like the SCTP one."""
    changed = 0
    for packet in list(packets(data)):
        if packet.linktype != LINKTYPE_ETHERNET or packet.caplen < 34:
            continue
        pkt, off = packet.offset, 12
        ethertype = struct.unpack_from(">H", data, pkt + off)[0]
        while ethertype in (0x8100, 0x88A8) and packet.caplen >= off + 6:
            off += 4
            ethertype = struct.unpack_from(">H", data, pkt + off)[0]
        ip = pkt + off + 2
        if ethertype != 0x0800 or data[ip + 9] != 6 or struct.unpack_from(">H", data, ip + 6)[0] & 0x1FFF:
            continue  # not TCP, or a later IPv4 fragment (no TCP header in it)
        tcp = ip + (data[ip] & 0x0F) * 4
        if tcp + 4 > pkt + packet.caplen:
            continue
        old = struct.unpack_from(">HH", data, tcp)
        new = tuple(ports.get(port, port) for port in old)
        if new != old:
            struct.pack_into(">HH", data, tcp, *new)
            changed += 1
    return changed


def shift_pcap(data: bytearray, seconds: int) -> None:
    """In place: add whole seconds to every timestamp of a classic pcap file."""
    endian = PCAP_MAGICS[bytes(data[:4])]
    for packet in list(packets(data)):
        sec = struct.unpack_from(endian + "I", data, packet.header)[0]
        struct.pack_into(endian + "I", data, packet.header, sec + seconds)


def keep_sctp_only(data: bytearray) -> bytearray:
    """A classic pcap holding only the file's Ethernet/IPv4/SCTP packets (an N2-only view)."""
    if bytes(data[:4]) not in PCAP_MAGICS:
        raise ValueError("keep_sctp_only reads classic pcap files only")
    out = bytearray(data[:24])
    for packet in packets(data):
        if sctp_in(data, packet) is not None:
            out += data[packet.header:packet.offset + packet.caplen]
    return out


def split_sctp_bundles(data: bytearray) -> tuple[bytearray, list[int]]:
    """A classic pcap in which every SCTP DATA chunk travels in its own packet.

    `tshark -T fields` prints one row per frame, so several NGAP PDUs bundled in one SCTP packet
    come out as comma-joined lists that cannot be paired field by field (a PDU without an AMF id
    shifts every later AMF id). With one chunk per frame each row is one PDU. Returns the new
    file and, for each new frame (index 0 = frame 1), the original frame number. Non-DATA chunks
    (SACK, ...) stay in a packet of their own; every packet keeps its original timestamp.
    """
    if bytes(data[:4]) not in PCAP_MAGICS:
        raise ValueError("split_sctp_bundles reads classic pcap files only")
    endian = PCAP_MAGICS[bytes(data[:4])]
    out = bytearray(data[:24])
    origin: list[int] = []
    for number, packet in enumerate(packets(data), start=1):
        found = sctp_in(data, packet)
        record = data[packet.header:packet.header + 8]  # timestamp
        if found is None:
            out += data[packet.header:packet.offset + packet.caplen]
            origin.append(number)
            continue
        head = data[packet.offset:found.sctp + 12]
        data_chunks: list[bytes] = []
        other = b""
        pos = found.sctp + 12
        while pos + 4 <= found.end:
            kind = data[pos]
            length = struct.unpack_from(">H", data, pos + 2)[0]
            if length < 4:
                break
            chunk = bytes(data[pos:min(pos + (length + 3) // 4 * 4, found.end)])
            if kind == 0:
                data_chunks.append(chunk)
            else:
                other += chunk
            pos += (length + 3) // 4 * 4
        bodies = ([other] if other else []) + data_chunks
        if len(bodies) <= 1:
            out += data[packet.header:packet.offset + packet.caplen]
            origin.append(number)
            continue
        ip = found.ip - packet.offset
        for body in bodies:
            pkt = bytearray(head) + body
            struct.pack_into(">H", pkt, ip + 2, len(pkt) - ip)  # IPv4 total length
            _ipv4_checksum(pkt, ip)
            out += record + struct.pack(endian + "II", len(pkt), len(pkt)) + pkt
            origin.append(number)
    return out, origin


LINKTYPE_SLL, LINKTYPE_SLL2 = 113, 276  # Linux cooked captures: IPv4 after a 16- / 20-byte header


def any_sctp_in(data: bytearray, packet: Packet) -> SctpPacket | None:
    """Like sctp_in, for Linux-cooked captures too (read-only uses: transplant)."""
    found = sctp_in(data, packet)
    if found is None and packet.linktype in (LINKTYPE_SLL, LINKTYPE_SLL2):
        ip = packet.offset + (16 if packet.linktype == LINKTYPE_SLL else 20)
        if data[ip] >> 4 == 4 and data[ip + 9] == 132:
            found = SctpPacket(ip, ip + (data[ip] & 0x0F) * 4, packet.offset + packet.caplen)
    return found


def data_chunk(data: bytearray, packet: Packet) -> tuple[int, int]:
    """(offset, padded length) of the first SCTP DATA chunk of an Ethernet or Linux-cooked packet."""
    found = any_sctp_in(data, packet)
    if found is None:
        raise ValueError("not an IPv4/SCTP packet")
    pos = found.sctp + 12
    while pos + 4 <= found.end:
        length = (struct.unpack_from(">H", data, pos + 2)[0] + 3) // 4 * 4
        if data[pos] == 0:
            return pos, length
        pos += max(length, 4)
    raise ValueError("no SCTP DATA chunk in the packet")


def with_payload(chunk: bytes | bytearray, payload: bytes) -> bytearray:
    """An SCTP DATA chunk (header as in `chunk`: flags, TSN, stream, PPID) carrying `payload` instead,
    its length field and padding to four bytes following."""
    out = bytearray(chunk[:16]) + payload
    struct.pack_into(">H", out, 2, len(out))
    return out + bytes(-len(out) % 4)


def replace_payload(data: bytearray, frame: int, payload: bytes) -> bytearray:
    """A copy of classic pcap `data` in which frame `frame`'s first SCTP DATA chunk carries `payload`
    (e.g. a hand-encoded NGAP PDU) instead of its own; every other byte of the file is kept.

    What the new length changes follows: the chunk's length and padding, the IPv4 total length and
    header checksum, the record's captured and original lengths (see the module docstring for the
    SCTP checksum). The frame keeps its time, TSN, stream and any other chunk it bundles.
    """
    if bytes(data[:4]) not in PCAP_MAGICS:
        raise ValueError("replace_payload reads classic pcap files only")
    endian = PCAP_MAGICS[bytes(data[:4])]
    packet = list(packets(data))[frame - 1]
    found = any_sctp_in(data, packet)
    if found is None:
        raise ValueError(f"frame {frame} is not an IPv4/SCTP packet")
    at, length = data_chunk(data, packet)
    chunk = with_payload(data[at:at + length], payload)
    delta = len(chunk) - length
    out = bytearray(data[:at]) + chunk + data[at + length:]
    struct.pack_into(">H", out, found.ip + 2, struct.unpack_from(">H", out, found.ip + 2)[0] + delta)
    _ipv4_checksum(out, found.ip)
    caplen, wirelen = struct.unpack_from(endian + "II", out, packet.header + 8)
    struct.pack_into(endian + "II", out, packet.header + 8, caplen + delta, wirelen + delta)
    return out


def transplant(target: bytearray, like: int, donor: bytearray, frame: int, *, tsn: int, time: float,
               patches: dict[int, tuple[int, int]] | None = None, payload: bytes | None = None) -> None:
    """In place: append to classic pcap `target` the DATA chunk of `donor`'s `frame`, sent as `like` was.

    The new packet is target frame `like`'s Ethernet/IPv4/SCTP common header (addresses, ports,
    verification tag: its association and direction) followed by the donor's first DATA chunk with
    TSN `tsn`, stamped `time`. `patches` maps an offset into the chunk's payload (its NGAP PDU,
    after the 16-byte DATA header) to (old byte, new byte); each old byte is checked. `payload`, if
    given, replaces the donor chunk's payload (before the patches), its lengths following.
    """
    if bytes(target[:4]) not in PCAP_MAGICS or bytes(donor[:4]) not in PCAP_MAGICS:
        raise ValueError("transplant reads classic pcap files only")
    endian = PCAP_MAGICS[bytes(target[:4])]
    nano = bytes(target[:4]) in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    template = list(packets(target))[like - 1]
    head_at = any_sctp_in(target, template)
    if head_at is None:
        raise ValueError(f"frame {like} is not an IPv4/SCTP packet")
    source = list(packets(donor))[frame - 1]
    at, length = data_chunk(donor, source)
    chunk = bytearray(donor[at:at + length]) if payload is None else with_payload(donor[at:at + length], payload)
    struct.pack_into(">I", chunk, 4, tsn)
    for offset, (old, new) in (patches or {}).items():
        if chunk[16 + offset] != old:
            raise ValueError(f"payload byte {offset} is {chunk[16 + offset]:#x}, not {old:#x}")
        chunk[16 + offset] = new
    pkt = bytearray(target[template.offset:head_at.sctp + 12]) + chunk
    ip = head_at.ip - template.offset
    struct.pack_into(">H", pkt, ip + 2, len(pkt) - ip)
    _ipv4_checksum(pkt, ip)
    seconds = int(time)
    fraction = round((time - seconds) * (1e9 if nano else 1e6))
    target += struct.pack(endian + "IIII", seconds, fraction, len(pkt), len(pkt)) + pkt


def ipv4_at(data: bytearray, packet: Packet) -> int | None:
    """Absolute offset of the outer IPv4 header of an Ethernet or Linux-cooked packet, or None."""
    if packet.linktype == LINKTYPE_ETHERNET and packet.caplen >= 34:
        off = 12
        while struct.unpack_from(">H", data, packet.offset + off)[0] in (0x8100, 0x88A8):
            off += 4
        if struct.unpack_from(">H", data, packet.offset + off)[0] != 0x0800:
            return None
        ip = packet.offset + off + 2
    elif packet.linktype in (LINKTYPE_SLL, LINKTYPE_SLL2):
        ip = packet.offset + (16 if packet.linktype == LINKTYPE_SLL else 20)
    else:
        return None
    return ip if ip + 20 <= packet.offset + packet.caplen and data[ip] >> 4 == 4 else None


def readdress_ipv4(data: bytearray, addresses: dict[str, str]) -> int:
    """In place: map the outer IPv4 source and destination addresses of every packet (any transport);
    returns how many packets changed. The IPv4 header checksum is recomputed; TCP and UDP checksums
    cover the addresses and are left as they were (Wireshark does not check them by default), so are
    SCTP's (CRC32c, which does not cover them). Tunnelled inner headers are not touched."""
    raw = {bytes(int(x) for x in k.split(".")): bytes(int(x) for x in v.split(".")) for k, v in addresses.items()}
    changed = 0
    for packet in list(packets(data)):
        ip = ipv4_at(data, packet)
        if ip is None:
            continue
        hit = False
        for field in (ip + 12, ip + 16):
            new = raw.get(bytes(data[field:field + 4]))
            if new is not None:
                data[field:field + 4], hit = new, True
        if hit:
            _ipv4_checksum(data, ip)
            changed += 1
    return changed


def to_ethernet(src: Path, dst: Path) -> int:
    """A Linux-cooked capture (SLL or SLL2) as classic Ethernet pcap, for replay onto a link (tcpreplay
    sends a file's frames as they are, and tcprewrite 4.4's --dlt=enet fails on SLL and knows no SLL2):
    each packet's cooked header becomes an Ethernet header carrying the cooked header's protocol, the
    sender's address (when it is six bytes) as source and a fixed locally administered destination; the
    rest of each packet and its timestamps are left as they were. Returns the packets written."""
    data = bytearray(src.read_bytes())
    if bytes(data[:4]) not in PCAP_MAGICS:
        raise ValueError(f"{src} is not classic pcap (convert it with editcap -F pcap first)")
    endian = PCAP_MAGICS[bytes(data[:4])]
    out = bytearray(data[:24])
    struct.pack_into(endian + "I", out, 20, LINKTYPE_ETHERNET)
    count = 0
    for packet in packets(data):
        if packet.linktype == LINKTYPE_SLL:
            cooked, proto, addr_len, addr = 16, data[packet.offset + 14:packet.offset + 16], \
                struct.unpack_from(">H", data, packet.offset + 4)[0], packet.offset + 6
        elif packet.linktype == LINKTYPE_SLL2:
            cooked, proto, addr_len, addr = 20, data[packet.offset:packet.offset + 2], \
                data[packet.offset + 11], packet.offset + 12
        else:
            raise ValueError(f"{src}: link type {packet.linktype} is not Linux cooked")
        source = bytes(data[addr:addr + 6]) if addr_len == 6 else b"\x02\x00\x00\x00\x00\x01"
        frame = b"\x02\x00\x00\x00\x00\x02" + source + bytes(proto) + \
            bytes(data[packet.offset + cooked:packet.offset + packet.caplen])
        ts_sec, ts_frac, _caplen, orig = struct.unpack_from(endian + "IIII", data, packet.header)
        out += struct.pack(endian + "IIII", ts_sec, ts_frac, len(frame), orig - cooked + 14) + frame
        count += 1
    dst.write_bytes(out)
    return count


NSEC_MAGIC = 0xA1B23C4D  # a pcap file of nanosecond timestamps


def write_ns_pcap(out: Path, linktype: int, records: Iterable[tuple[int, bytes | bytearray]]) -> Path:
    """A nanosecond pcap of `records` ((epoch ns, frame) in file order) at `out`, written whole through a
    temporary file and a rename (two test workers may build the same cached file at once)."""
    body = bytearray(struct.pack("<IHHiIII", NSEC_MAGIC, 2, 4, 0, 0, 262144, linktype))
    for at_ns, frame in records:
        sec, nsec = divmod(at_ns, 10**9)
        body += struct.pack("<IIII", sec, nsec, len(frame), len(frame)) + frame
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(bytes(body))
    tmp.replace(out)
    return out



def fragment_ipv4(data: bytearray, packet: Packet, first: int) -> list[bytearray]:
    """The packet as two frames carrying its outer IPv4 packet in two fragments (the first `first` bytes of
    its payload, a multiple of 8, then the rest), each with the packet's own link header: what a router
    that fragments a tunnel's outer packet (GTP-U over a small MTU) sends."""
    ip = ipv4_at(data, packet)
    if ip is None or first % 8:
        raise ValueError("an Ethernet or Linux-cooked IPv4 packet and a multiple of 8 are needed")
    link = bytes(data[packet.offset:ip])
    header = (data[ip] & 0x0F) * 4
    total = struct.unpack_from(">H", data, ip + 2)[0]
    payload = bytes(data[ip + header:ip + total])
    frames = []
    for offset, part, more in ((0, payload[:first], True), (first, payload[first:], False)):
        piece = bytearray(data[ip:ip + header]) + part
        struct.pack_into(">H", piece, 2, header + len(part))
        struct.pack_into(">H", piece, 6, (0x2000 if more else 0) | offset // 8)
        _ipv4_checksum(piece, 0)
        frames.append(bytearray(link) + piece)
    return frames
