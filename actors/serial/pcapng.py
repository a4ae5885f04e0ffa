"""A small, exact pcapng writer for serial sessions (the blocks and options of the pcapng spec,
draft-ietf-opsawg-pcapng, that `export_serial_pcapng` needs; nothing else).

Link type: LINKTYPE_WIRESHARK_UPPER_PDU (252). Each packet starts with exported-PDU tags naming the
dissector Wireshark hands the bytes to, so tshark and sharkd decode a serial chunk as text lines
(`data-text-lines`) with no decode-as, profile or user-DLT table; the chunk's own bytes follow the
tags unchanged (`exported_pdu.exported_pdu` shows them). The direction is in each packet's
`epb_flags` (inbound = Rx, outbound = Tx), which Wireshark also shows as `frame.p2p_dir`
(1 = received, 0 = sent).

Everything is little-endian (a reader detects the byte order from the SHB's magic); the exported
PDU tags are big-endian, as Wireshark writes and reads them.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

LINKTYPE_WIRESHARK_UPPER_PDU = 252
DISSECTOR = "data-text-lines"

_SHB, _IDB, _EPB = 0x0A0D0D0A, 0x00000001, 0x00000006
_BYTE_ORDER_MAGIC = 0x1A2B3C4D
# Option codes.
_OPT_END, _OPT_COMMENT = 0, 1
_SHB_USERAPPL = 4
_IF_NAME, _IF_DESCRIPTION, _IF_TSRESOL = 2, 3, 9
_EPB_FLAGS = 2
_INBOUND, _OUTBOUND = 0b01, 0b10  # epb_flags bits 0-1
# Exported PDU tags (Wireshark's exported_pdu.h).
_EXP_PDU_TAG_END_OF_OPT, _EXP_PDU_TAG_DISSECTOR_NAME = 0, 12


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + _pad(value)


def _options(*options: tuple[int, bytes]) -> bytes:
    return b"".join(_option(code, value) for code, value in options) + _option(_OPT_END, b"")


def _block(block_type: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack("<II", block_type, total) + body + struct.pack("<I", total)


def _exported_pdu_header(dissector: str) -> bytes:
    name = _pad(dissector.encode())  # NUL-padded to 4 bytes, as Wireshark itself writes it
    return (struct.pack(">HH", _EXP_PDU_TAG_DISSECTOR_NAME, len(name)) + name
            + struct.pack(">HH", _EXP_PDU_TAG_END_OF_OPT, 0))


class PcapngWriter:
    """Writes one section with one interface to a binary file object, block by block (no buffering
    of its own: memory stays bounded whatever the number of packets)."""

    TSRESOL_US = 6  # if_tsresol 6: timestamps count microseconds, the raw log's resolution

    def __init__(self, out: BinaryIO, *, application: str, comment: str, if_name: str, if_description: str) -> None:
        self._out = out
        self._header = _exported_pdu_header(DISSECTOR)
        self.packets = 0
        out.write(_block(_SHB, struct.pack("<IHHq", _BYTE_ORDER_MAGIC, 1, 0, -1)  # section length unknown
                         + _options((_SHB_USERAPPL, application.encode()), (_OPT_COMMENT, comment.encode()))))
        out.write(_block(_IDB, struct.pack("<HHI", LINKTYPE_WIRESHARK_UPPER_PDU, 0, 0)  # snaplen 0: no limit
                         + _options((_IF_NAME, if_name.encode()), (_IF_DESCRIPTION, if_description.encode()),
                                    (_IF_TSRESOL, bytes([self.TSRESOL_US])))))

    def packet(self, ts_us: int, data: bytes, *, inbound: bool) -> None:
        """One Enhanced Packet Block: `data` at `ts_us` microseconds since the epoch."""
        payload = self._header + data
        flags = _INBOUND if inbound else _OUTBOUND
        body = (struct.pack("<IIIII", 0, ts_us >> 32, ts_us & 0xFFFFFFFF, len(payload), len(payload))
                + _pad(payload) + _options((_EPB_FLAGS, struct.pack("<I", flags))))
        self._out.write(_block(_EPB, body))
        self.packets += 1
