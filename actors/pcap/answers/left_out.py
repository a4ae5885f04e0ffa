"""What the NGAP summaries leave out of a capture because tshark did not decode it, and how to include it.

SBI on a TCP port Wireshark does not know (Open5GS 7777, free5GC 8000, ...) is HTTP/2 that tshark
shows as bare TCP payload unless a decode-as rule names the port: its CreateSMContext,
N1N2MessageTransfer and Nsmf_PDUSession Create calls are then missing from `n4_sbi`, silently. The
conversations that carry HTTP/2 are those decode_check.py's probe finds (one tshark pass without any
rule: the connection preface, or a run of valid HTTP/2 frame headers); those no applied rule decodes
are named here with the rule that shows them (decode_check.advice, which hides nothing else).
(Ciphered NAS, the other part a summary cannot read, is counted by the NGAP model itself:
ngap/associations.py.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from diagd.actors.pcap.shark.decode_check import Conversation, Probe, advice


def http2_ports(rules: Iterable[str]) -> set[int]:
    """The TCP ports the applied decode-as rules hand to HTTP/2 (`tcp.port==N,http2`, a range `N-M`, or
    tshark's `N:count`)."""
    ports: set[int] = set()
    for rule in rules:
        selector, _, proto = rule.partition(",")
        table, _, value = selector.partition("==")
        if table.strip() != "tcp.port" or proto.strip() != "http2":
            continue
        value = value.strip()
        low, dash, high = value.partition("-")
        base, colon, count = value.partition(":")
        if value.isdigit():
            ports.add(int(value))
        elif dash and low.isdigit() and high.isdigit():
            ports.update(range(int(low), int(high) + 1))
        elif colon and base.isdigit() and count.isdigit():
            ports.update(range(int(base), int(base) + int(count)))
    return ports


def undecoded_http2(found: Probe, applied: Iterable[str]) -> dict[int, list[Conversation]]:
    """Port -> the conversations that carry HTTP/2 there and that neither tshark on its own nor an applied rule
    decodes. The port is the server's when the capture shows which end that is (a preface, a port several
    conversations share), else the lower one (decode_check.Conversation.server_port): a rule naming it decodes
    the conversation either way."""
    covered = http2_ports(applied)
    shared = found.shared()
    by_port: dict[int, list[Conversation]] = defaultdict(list)
    for conv in found.conversations.values():
        if conv.carries == "HTTP/2" and "http2" not in conv.layers and not covered.intersection(conv.ports):
            by_port[conv.server_port(found.named, shared)].append(conv)
    return dict(sorted(by_port.items()))


def sbi_warning(found: Probe, applied: Iterable[str]) -> str | None:
    """The warning every NGAP summary carries when SBI was left undecoded: how much, where, and how to include it."""
    left = undecoded_http2(found, applied)
    if not left:
        return None
    count = sum(len(convs) for convs in left.values())
    where = ", ".join(f"tcp/{port} ({len(convs)})" for port, convs in left.items())
    how = "; ".join(f"tcp/{port}: {advice(found, port)}" for port in left)
    return (f"SBI left out: {count} TCP conversations carry HTTP/2 that tshark did not decode (a port it does not "
            f"know), by port: {where}; the SBI calls among them (CreateSMContext, N1N2MessageTransfer, "
            f"Nsmf_PDUSession Create) are missing from n4_sbi (view=procedures). To include them: {how}")
