"""A home-routed roaming capture built from a real run: the V-SMF's Nsmf_PDUSession Create at two H-SMFs.

No capture of the corpus has home-routed roaming. Here the merged N2/N4/SBI views of the sandbox run in which UE
2's PDUSessionResourceSetupResponse is lost (built_captures.MERGES "sandbox-n2-n4-sbi-ue2-response-lost": UE 2's
establishment stays unanswered, its window runs over UE 3's whole establishment, frames 1140 to 1233) get two
more HTTP/2 conversations on tcp/7777, in UE 3's window, from its SMF (10.53.0.12, as V-SMF) to two H-SMFs: the
first answers 503 (no UE address), the second 201 with PduSessionCreatedData's ueIpv4Address 192.168.100.16 (UE
3's PDU address in its NAS accept). Each request's JSON (PduSessionCreateData, TS 29.502 6.1.6.2.9) names UE 3's
SUPI imsi-999700000000001 and PDU session id 1. Every packet is the sandbox's SBI frame 604 (Ethernet / IPv4 /
TCP, SCP to SMF on 7777) with its addresses, ports, sequence numbers and payload replaced: hand-encoded HTTP/2
(RFC 9113 frames; HPACK, RFC 7541, with literal names and values only, no Huffman), the IPv4 lengths and
checksum following (the TCP checksum is not checked by Wireshark). mergecap puts them in time order.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

from tests.support.built_captures import CORPORA, merged
from tests.support.ngap_oracle import CACHE
from tests.support.pcapedit import PCAP_MAGICS, _ipv4_checksum, packets

BASE = "sandbox-n2-n4-sbi-ue2-response-lost"
TEMPLATE = ("pcaps/adrian_sandbox_sbi.pcap", 604)
V_SMF = "10.53.0.12"
H_SMFS = (("10.53.0.41", 45001, 503), ("10.53.0.40", 45002, 201))  # (H-SMF, V-SMF's port, answer)
START = 1787139441.0140  # inside UE 3's window (1787139441.012755 to .029060) and UE 2's (to the capture's end)
SUPI, PSI, UE_IPV4 = "imsi-999700000000001", 1, "192.168.100.16"
PATH = "/nsmf-pdusession/v1/pdu-sessions"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(index: int, value: str) -> bytes:
    """HPACK literal header field without indexing, indexed name (4-bit prefix), value not Huffman-coded."""
    head = bytes([index]) if index < 15 else bytes([15, index - 15])
    return head + bytes([len(value)]) + value.encode()


def request(h_smf: str) -> bytes:
    headers = (b"\x83" + b"\x86" + literal(4, PATH) + literal(1, f"{h_smf}:7777")  # POST, http, :path, :authority
               + literal(31, "application/json"))
    body = json.dumps({"supi": SUPI, "pduSessionId": PSI, "dnn": "internet", "sNssai": {"sst": 1},
                       "vsmfId": "6d1f1a3c-0000-4000-8000-000000000001",
                       "servingNetwork": {"mcc": "999", "mnc": "70"}, "anType": "3GPP_ACCESS",
                       # split: tests/test_docs.py reads URLs in this file as links (this one is packet data)
                       "vsmfPduSessionUri": "http" + f"://{V_SMF}:7777/nsmf-pdusession/v1/pdu-sessions/{PSI}"},
                      separators=(",", ":")).encode()
    return frame(4, 1, 0, b"") + frame(1, 4, 1, headers) + frame(0, 1, 1, body)  # SETTINGS ACK, HEADERS, DATA


def answer(status: int) -> bytes:
    if status == 201:
        body = {"pduType": "IPV4", "sscMode": "1", "hcnTunnelInfo": {"ipv4Addr": "10.53.0.50", "gtpTeid": "0000a001"},
                "ueIpv4Address": UE_IPV4, "sNssai": {"sst": 1}}
        kind = "application/json"
    else:
        body = {"status": status, "cause": "INSUFFICIENT_RESOURCES"}
        kind = "application/problem+json"
    data = json.dumps(body, separators=(",", ":")).encode()
    return frame(1, 4, 1, literal(8, str(status)) + literal(31, kind)) + frame(0, 1, 1, data)


def built() -> Path:
    """The capture (its path even when the corpus is missing: callers check exists())."""
    source = Path(__file__).read_bytes()
    out = CACHE / f"built-roaming-h-smf-{hashlib.sha256(source).hexdigest()[:8]}.pcap"
    base = merged(BASE)
    if out.exists() or not base.exists() or not (CORPORA / TEMPLATE[0]).exists() or shutil.which("mergecap") is None:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    data = bytearray((CORPORA / TEMPLATE[0]).read_bytes())
    endian = PCAP_MAGICS[bytes(data[:4])]
    template = list(packets(data))[TEMPLATE[1] - 1]
    pkt = bytes(data[template.offset:template.offset + template.caplen])
    ip = 14
    tcp = ip + (pkt[ip] & 0x0F) * 4
    head = pkt[:tcp + (pkt[tcp + 12] >> 4) * 4]
    extra = bytearray(data[:24])
    time = START
    for h_smf, port, status in H_SMFS:
        seq = {"v": 1000, "h": 5000}
        for sender, payload in (("v", PREFACE + frame(4, 0, 0, b"")), ("h", frame(4, 0, 0, b"") + frame(4, 1, 0, b"")),
                                ("v", request(h_smf)), ("h", answer(status))):
            new = bytearray(head) + payload
            src, dst = (V_SMF, h_smf) if sender == "v" else (h_smf, V_SMF)
            new[ip + 12:ip + 20] = bytes(int(x) for x in src.split(".")) + bytes(int(x) for x in dst.split("."))
            struct.pack_into(">H", new, ip + 2, len(new) - ip)
            _ipv4_checksum(new, ip)
            other = "h" if sender == "v" else "v"
            struct.pack_into(">HHII", new, tcp, *((port, 7777) if sender == "v" else (7777, port)), seq[sender],
                             seq[other])
            new[tcp + 13] = 0x18  # PSH, ACK
            seq[sender] += len(payload)
            seconds = int(time)
            extra += struct.pack(endian + "IIII", seconds, round((time - seconds) * 1e6), len(new), len(new)) + new
            time += 0.0004
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    part = out.with_suffix(f".{os.getpid()}.part")
    part.write_bytes(bytes(extra))
    subprocess.run(["mergecap", "-F", "pcap", "-w", str(tmp), str(base), str(part)], check=True, capture_output=True)
    part.unlink()
    tmp.replace(out)  # a stable path and mtime: the sharkd trees and oracle answers stay cached
    return out
