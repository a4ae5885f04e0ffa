"""Service response time of HTTP/2 (5G SBI) for pcap_stats: Wireshark 4.0.17 has no HTTP/2 SRT tap and
no request/response link in its HTTP/2 dissector, so requests and responses are paired here.

Each HTTP/2 HEADERS frame is read from the frame's decode tree (sharkd `frame`), because one TCP segment
often carries several HTTP/2 frames and flat field columns cannot say which :method belongs to which
stream id. A request is a HEADERS frame with :method or :path (a connection opened before the capture
loses HPACK state, and :method can be missing while :path is not: the method is then `?`; the path is `?`
the other way round); its response is the first later HEADERS frame on the same TCP stream and HTTP/2
stream id sent from the other end (by TCP source port), whose :status is `?` when HPACK state was lost.
The response time is the difference of the two frames' relative times, in whole nanoseconds.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from diagd.actors.base import Request
from diagd.actors.pcap.answer_types import StatsAnswer
from diagd.actors.pcap.engine.session import CaptureSession

HEADERS = "http2.type == 1"
FIELDS = ("frame.number", "frame.time_relative", "tcp.stream", "tcp.srcport", "http2.type", "http2.streamid",
          "http2.header.count", "http2.header.name", "http2.header.value")
_ITEM = re.compile(r"^(http2\.(?:type|streamid|headers\.method|headers\.path|headers\.status)) == (.*)$")
# Path segments that name one resource rather than a resource type: numbers, UUIDs, long hex strings and
# the 5G subscriber/equipment ids (SUPI, SUCI, GPSI, PEI: imsi-…, suci-…, msisdn-…, imei-…).
_ID = re.compile(r"^(?:\d+|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9a-fA-F]{16,}"
                 r"|(?:imsi|suci|supi|nai|gci|gli|gpsi|msisdn|extid|imei|imeisv|mac)-.+)$")


def template(path: str) -> str:
    """The path without its query, each id-like segment replaced by {id}:
    /nudm-sdm/v2/imsi-999700000000001/sm-data?dnn=x -> /nudm-sdm/v2/{id}/sm-data."""
    return "/".join("{id}" if _ID.match(part) else part for part in path.split("?")[0].split("/"))


@dataclass
class Message:
    """One HTTP/2 HEADERS frame: its stream and the pseudo-headers it carries."""

    stream: int
    pseudo: dict[str, str] = field(default_factory=dict)


def headers_frames(tree: list[dict[str, Any]]) -> list[Message]:
    """The HEADERS frames in one packet's decode tree, in order."""
    found: list[Message] = []
    for node in tree:
        if node.get("f") == "http2":
            for item in node.get("n", []):  # one child per HTTP/2 frame ("Stream: HEADERS, Stream ID: 15, ...")
                values = dict(_items(item.get("n", [])))
                if values.get("http2.type") == "1" and "http2.streamid" in values:
                    found.append(Message(int(values["http2.streamid"]),
                                         {k.rsplit(".", 1)[1]: v for k, v in values.items() if ".headers." in k}))
        else:
            found += headers_frames(node.get("n", []))
    return found


def _items(nodes: list[dict[str, Any]]) -> list[tuple[str, str]]:
    items: list[tuple[str, str]] = []
    for node in nodes:
        if m := _ITEM.match(str(node.get("f", ""))):
            value = m.group(2)
            items.append((m.group(1), json.loads(value) if value.startswith('"') else value))
        items += _items(node.get("n", []))
    return items


def nanoseconds(seconds: str) -> int:
    whole, _, fraction = seconds.strip().partition(".")
    sign = -1 if whole.startswith("-") else 1
    return sign * (abs(int(whole or "0")) * 1_000_000_000 + int((fraction + "000000000")[:9]))


def _row(procedure: str, times: list[int], not_paired: int, why: str, statuses: Counter[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"procedure": procedure, "count": len(times)}
    if times:
        row.update(min_s=min(times) / 1e9, max_s=max(times) / 1e9, avg_s=round(sum(times) / len(times) / 1e9, 9),
                   sum_s=sum(times) / 1e9)
    row["not_paired"] = {why: not_paired} if not_paired else {}
    row["statuses"] = dict(sorted(statuses.items()))
    return row


async def srt(capture: CaptureSession, request: Request, display_filter: str) -> StatsAnswer:
    flt = f"{HEADERS} && ({display_filter})" if display_filter else HEADERS
    await capture.check_filter(request, flt)
    params: dict[str, Any] = {"column0": "frame.time_relative:0", "column1": "tcp.stream:0",
                              "column2": "tcp.srcport:0", "filter": flt}
    frames = await capture.sharkd_call(request, "frames", params, display_filter=flt)
    # (tcp stream, h2 stream) -> (procedure, ns, the requester's TCP port)
    open_requests: dict[tuple[int, int], tuple[str, int, str]] = {}
    times: dict[str, list[int]] = defaultdict(list)
    statuses: dict[str, Counter[str]] = defaultdict(Counter)
    requests = responses = orphans = 0
    for frame in sorted(frames, key=lambda f: int(f["num"])):
        number = int(frame["num"])
        at = nanoseconds(str(frame["c"][0]))
        tcp = int(str(frame["c"][1]).split(",")[0] or -1)
        port = str(frame["c"][2]).split(",")[0]
        tree = (await capture.sharkd_call(request, "frame", {"frame": number, "proto": True})).get("tree", [])
        for message in headers_frames(tree):
            key = (tcp, message.stream)
            if "method" in message.pseudo or "path" in message.pseudo:
                requests += 1
                path = message.pseudo.get("path")
                name = f"{message.pseudo.get('method', '?')} {'?' if path is None else template(path)}"
                open_requests[key] = (name, at, port)
            elif key in open_requests and open_requests[key][2] != port:
                responses += 1
                name, started, _ = open_requests.pop(key)
                times[name].append(at - started)
                statuses[name][message.pseudo.get("status", "?")] += 1
            elif "status" in message.pseudo:
                responses += 1
                orphans += 1  # its request was before the capture or not decoded
    unpaired = Counter(name for name, _, _ in open_requests.values())
    why = "no response among the frames display_filter keeps" if display_filter else "no response in the capture"
    rows = [_row(p, times[p], unpaired[p], why, statuses[p]) for p in sorted(set(times) | set(unpaired))]
    return {"method": "computed: HEADERS with :method/:path paired with the next HEADERS from the other end on "
                      "the same tcp.stream and http2.streamid (status '?': HPACK state lost), from sharkd's "
                      "decode tree of each frame (Wireshark 4.0.17 has no HTTP/2 SRT tap); ids in paths as {id}",
            "rows": rows, "requests": requests, "responses": responses, "responses_without_request": orphans}
