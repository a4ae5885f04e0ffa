"""Service response times (pcap_stats kind=srt) of GTPv2-C, PFCP, SIP and HTTP/1.1 from an indexed capture,
paired by pairing.py exactly as for a loaded capture, without loading it: each message read in the loaded
capture's own columns by tshark over a cut of the frames carrying the protocol's layer
(index/cut_columns.py; an ICMP error quoting a request carries the request's layer too). Relative times are
the cut's, whose differences (the response times) are the whole file's; the capture's end, which a
request's response timer is measured to, is the latest arrival of any frame, as sharkd's `analyse` says it.
A display filter is applied over the cut when it means there what it means in the whole file (its names
no frame numbers, no numbering: narrowing.cut_safe). Diameter (Wireshark's own SRT tap) and HTTP/2 (paired
by stream over sharkd's reassembly) are not read here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from diagd.actors.pcap.answer_types import StatsAnswer
from diagd.actors.pcap.answers import pairing
from diagd.actors.pcap.index import cut_columns, narrowing, query
from diagd.actors.pcap.messages import Stats

# The layers every frame of a protocol's rules.filter carries one of: HTTP/1.1 is `http`, or `ssdp` over UDP
# (the HTTP dissector under SSDP's name).
LAYERS = {"gtpv2": ("gtpv2",), "pfcp": ("pfcp",), "sip": ("sip",), "http": ("http", "ssdp")}
# The frames whose messages are held for pairing (as the loaded capture's are, ~0.8 KB a message and 0.1 KB a
# frame read, while tshark reads the cut beside): more are refused, the daemon and its children staying in
# their 1.5 GB budget.
MAX_FRAMES = 400_000


def answers(message: Stats) -> bool:
    """Whether the index answers these response times: of a protocol read here, of the whole capture or
    of the frames a filter keeps that means in a cut what it means in the whole file (narrowing.cut_safe)."""
    if message.protocol not in LAYERS:
        return False
    return not message.display_filter or (message.kinds is not None
                                          and narrowing.cut_safe(message.display_filter, message.kinds))


async def srt(capture: Path, index: Path, meta: dict[str, Any], argv: list[str], protocol: str,
              display_filter: str) -> StatsAnswer:
    """The response times of `protocol` in `capture` (its index at `index`, `meta` its meta.json; `argv`:
    its own two-pass tshark command), of the frames `display_filter` keeps, as pairing.srt gives them from
    the loaded capture."""
    frames = int(meta.get("frames") or 0)
    rules = pairing.RULES[protocol]
    flt = f"({rules.filter}) && ({display_filter})" if display_filter else rules.filter
    messages: list[pairing.Message] = []
    cut = await cut_columns.read(capture, index, frames, argv, flt, cut_columns.Columns(tuple(pairing.columns(rules))),
                                 LAYERS[protocol], lambda number, row: messages.extend(rules.decode(number, row)),
                                 purpose=f"pair {protocol} messages", max_frames=MAX_FRAMES)
    end = await trio.to_thread.run_sync(query.latest_epoch, index, meta)
    result = await trio.to_thread.run_sync(pairing.pair, rules, messages, end, bool(display_filter))
    result["method"] += (f"; read by tshark -2 over {cut} of the capture's {frames} frames, cut from the file by "
                         f"its index (those carrying {' or '.join(LAYERS[protocol])}, with what their dissection "
                         "depends on)")
    return result
