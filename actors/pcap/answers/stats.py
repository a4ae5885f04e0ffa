"""Wireshark's statistics (pcap_stats): expert info, service response times, conversations,
endpoints and I/O intervals, from the warm sharkd worker of a capture.

Each kind is what `tshark -q -z <tap>` prints for the same capture (`tap_command` names it):
sharkd's own taps (`expert`, `srt:diameter`, `conv:*`, `endpt:*`) and its `intervals` method.
Diameter's SRT tap pairs an answer with its request by hop-by-hop and end-to-end identifier on the
transport connection, as the protocol does, and is kept. Wireshark 4.0.17 has no SRT tap for GTPv2, PFCP,
SIP or HTTP, and its request/response links there are not the protocols' own pairing (4.0 does not link
some GTPv2 message types, links SIP ACKs, takes ICMP errors for requests), so those are paired here from
each message's fields (pairing.py; HTTP/2 by stream: http2_srt.py); each answer says which method gave it.
"""

from __future__ import annotations

import difflib
from collections import Counter, defaultdict
from typing import Any

from diagd.actors.base import Request
from diagd.actors.pcap.answer_types import StatsAnswer
from diagd.actors.pcap.answers import http2_srt as http2
from diagd.actors.pcap.answers import pairing
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.actors.pcap.messages import Stats
from diagd.protocol.errors import DiagdError, ErrorCode

KINDS = ("expert", "srt", "conversations", "endpoints", "io")
MAX_INTERVALS = 200_000  # I/O rows of one answer from sharkd's frames (~60 MB); an index pages any number
# The protocol names a caller may give -> sharkd's table name (its `info` lists them as conv:<name>).
CONV_TABLES = {"eth": "Ethernet", "ip": "IPv4", "ipv6": "IPv6", "tcp": "TCP", "udp": "UDP", "sctp": "SCTP"}
CONV_ALIASES = {"ipv4": "ip", "ethernet": "eth"}
SEVERITIES = ("Error", "Warning", "Note", "Chat", "Comment")  # the order tshark -z expert prints them in
NATIVE_SRT = {"diameter": "srt:diameter"}
SRT_PROTOCOLS = (*NATIVE_SRT, *pairing.RULES, "http2")


def _close(name: str, known: list[str]) -> dict[str, list[str]]:
    return {name: difflib.get_close_matches(name, known, n=3, cutoff=0.4)}


def resolve(kind: str, protocol: str | None, display_filter: str, interval_ms: int | None) -> Stats:
    """The question in canonical form, or a coded error naming what this Wireshark supports."""
    proto = (protocol or "").strip().lower() or None
    if kind in ("conversations", "endpoints"):
        proto = CONV_ALIASES.get(proto or "ip", proto or "ip")
        if proto not in CONV_TABLES:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"no {kind} table for protocol {protocol!r}",
                             supported=list(CONV_TABLES), did_you_mean=_close(proto, list(CONV_TABLES)))
    elif kind == "srt":
        if proto not in SRT_PROTOCOLS:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"no service response time for protocol {protocol!r} in this Wireshark (4.0.17)",
                             supported=list(SRT_PROTOCOLS), did_you_mean=_close(proto or "", list(SRT_PROTOCOLS)))
    elif kind in ("expert", "io"):
        proto = None
    else:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown kind {kind!r}", supported=list(KINDS),
                         did_you_mean=_close(kind, list(KINDS)))
    if (display_filter and kind in ("expert", "conversations", "endpoints")) or (
            display_filter and proto in NATIVE_SRT):
        # sharkd 4.0 registers its taps with an empty filter and refuses a `filter` member.
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"kind={kind} takes no display_filter: sharkd 4.0 runs its taps over the whole capture",
                         hint="pcap_extract_subcapture with the filter, then pcap_stats on the file it writes")
    interval = interval_ms if kind == "io" else None
    if kind == "io" and interval is None:
        interval = 1000
    return Stats(kind, proto, display_filter, interval)


def tap_command(message: Stats) -> list[str]:
    """The tshark arguments that print the same statistics (after the capture's own options)."""
    match message.kind:
        case "expert":
            return ["-q", "-z", "expert"]
        case "conversations":
            return ["-q", "-z", f"conv,{message.protocol}"]
        case "endpoints":
            return ["-q", "-z", f"endpoints,{message.protocol}"]
        case "io":
            seconds = f"{(message.interval_ms or 1000) / 1000:g}"
            return ["-q", "-z", f"io,stat,{seconds}" + (f",{message.display_filter}" if message.display_filter
                                                       else "")]
    if message.protocol in NATIVE_SRT:
        return ["-q", "-z", f"{message.protocol},srt"]
    if message.protocol == "http2":
        flt = http2.HEADERS + (f" && ({message.display_filter})" if message.display_filter else "")
        return ["-Y", flt, "-T", "fields", "-E", "occurrence=a", *[a for f in http2.FIELDS for a in ("-e", f)]]
    rules = pairing.RULES[message.protocol or ""]
    flt = f"({rules.filter}) && ({message.display_filter})" if message.display_filter else rules.filter
    fields = [c.rsplit(":", 1)[0] for c in pairing.columns(rules)]
    return ["-Y", flt, "-T", "fields", "-E", "occurrence=a", *[a for f in fields for a in ("-e", f)]]


async def answer(capture: CaptureSession, request: Request, message: Stats) -> StatsAnswer:
    """Every row of the statistics (the tool pages them), with `method` and, when empty, `reason`."""
    match message.kind:
        case "expert":
            result = await _expert(capture, request)
        case "conversations" | "endpoints":
            result = await _conversations(capture, request, message)
        case "io":
            result = await _io(capture, request, message)
        case _ if message.protocol == "http2":
            result = await http2.srt(capture, request, message.display_filter)
        case _:
            result = await (_native_srt(capture, request, message) if message.protocol in NATIVE_SRT
                            else pairing.srt(capture, request, pairing.RULES[message.protocol or ""],
                                             message.display_filter))
    if not result["rows"] and "reason" not in result:
        result["reason"] = await _why_empty(capture, request, message)
    return result


async def _why_empty(capture: CaptureSession, request: Request, message: Stats) -> str:
    present = (await capture.analysed(request)).get("protocols", [])
    reason = message.why_empty(present)
    if message.protocol == "http2" and message.protocol not in present:
        reason += f"; {await capture.sbi_hint()}"
    return reason


async def _tap(capture: CaptureSession, request: Request, name: str) -> dict[str, Any]:
    answer = await capture.sharkd_call(request, "tap", {"tap0": name})
    taps: list[dict[str, Any]] = answer.get("taps", [])
    return taps[0] if taps else {}


async def _expert(capture: CaptureSession, request: Request) -> StatsAnswer:
    details = (await _tap(capture, request, "expert")).get("details", [])
    groups: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)
    for item in details:
        groups[(item.get("s", ""), item.get("g", ""), item.get("p", ""), item.get("m", ""))].append(int(item["f"]))
    order = {s: i for i, s in enumerate(SEVERITIES)}
    rows: list[dict[str, Any]] = [{"severity": s, "group": g, "protocol": p, "summary": m, "count": len(frames),
             "first_frame": min(frames), "frames": sorted(frames)[:5]}
            for (s, g, p, m), frames in groups.items()]
    rows.sort(key=lambda r: (order.get(r["severity"], 9), -r["count"], r["protocol"], r["summary"]))
    by_severity = Counter(str(item.get("s", "")) for item in details)
    by_protocol: dict[str, Counter[str]] = defaultdict(Counter)
    for item in details:
        by_protocol[str(item.get("p", ""))][str(item.get("s", ""))] += 1
    return {"method": "sharkd tap expert", "rows": rows, "items": len(details),
            "by_severity": {s: by_severity[s] for s in SEVERITIES if by_severity[s]},
            "by_protocol": {p: dict(c) for p, c in sorted(by_protocol.items())}}


def _endpoint(addr: str, port: Any) -> str:
    return f"{addr}:{port}" if port not in (None, "") else addr


async def _conversations(capture: CaptureSession, request: Request, message: Stats) -> StatsAnswer:
    table = CONV_TABLES[message.protocol or "ip"]
    if message.kind == "conversations":
        tap = await _tap(capture, request, f"conv:{table}")
        rows = [{"a": _endpoint(c["saddr"], c.get("sport")), "b": _endpoint(c["daddr"], c.get("dport")),
                 "frames": c["txf"] + c["rxf"], "bytes": c["txb"] + c["rxb"],
                 "a_to_b_frames": c["txf"], "a_to_b_bytes": c["txb"],
                 "b_to_a_frames": c["rxf"], "b_to_a_bytes": c["rxb"],
                 "rel_start_s": c.get("start"), "duration_s": _duration(c), "filter": c.get("filter")}
                for c in tap.get("convs", [])]
        method = f"sharkd tap conv:{table}"
    else:
        tap = await _tap(capture, request, f"endpt:{table}")
        rows = [{"address": _endpoint(h["host"], h.get("port")), "frames": h["txf"] + h["rxf"],
                 "bytes": h["txb"] + h["rxb"], "tx_frames": h["txf"], "tx_bytes": h["txb"],
                 "rx_frames": h["rxf"], "rx_bytes": h["rxb"], "filter": h.get("filter")}
                for h in tap.get("hosts", [])]
        method = f"sharkd tap endpt:{table}"
    rows.sort(key=lambda r: (-r["bytes"], -r["frames"]))
    return {"method": method, "rows": rows}


def _duration(conv: dict[str, Any]) -> float | None:
    start, stop = conv.get("start"), conv.get("stop")
    return round(stop - start, 9) if isinstance(start, int | float) and isinstance(stop, int | float) else None


async def _io(capture: CaptureSession, request: Request, message: Stats) -> StatsAnswer:
    """Frames and bytes per interval, binned here as tshark 4.0's io,stat tap (ui/cli/tap-iostat.c) bins
    them: sharkd's `intervals` bins a float of milliseconds, and a frame on a boundary lands one interval
    off. The tap reads frames in file order, keeps one current interval and only moves it forward, so a
    frame out of time order (earlier than the current interval's start) counts in the current interval."""
    interval = message.interval_ms or 1000
    step = interval * 1000  # us, the tap's unit
    if message.display_filter:
        await capture.check_filter(request, message.display_filter)
    wanted = set(await capture.matching(request, message.display_filter)) if message.display_filter else None
    frames = await capture.sharkd_call(request, "frames",
                                       {"column0": "frame.time_relative:0", "column1": "frame.len:0"})
    bins: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    last = -1
    current = 0  # the current interval's start (us); a filtered tap sees (and moves on) matching frames only
    for frame in sorted(frames, key=lambda f: int(f["num"])):  # file order, as the tap sees them
        at = _microseconds(str(frame["c"][0]))
        last = max(last, at // step)  # every interval up to the capture's end, empty ones too, as tshark prints
        if wanted is None or int(frame["num"]) in wanted:
            while at >= current + step:
                current += step
            bins[current // step][0] += 1
            bins[current // step][1] += int(frame["c"][1])
    if last + 1 > MAX_INTERVALS:  # every row is held (and cached) before the tool pages them
        fits = -(-(last + 1) * interval // MAX_INTERVALS)
        raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE,
                         f"{last + 1} intervals of {interval} ms: more than the {MAX_INTERVALS} one answer holds",
                         hint=f"interval_ms of at least {fits}, or pcap_index the capture: its I/O intervals are "
                              "paged where they are kept, any number of them", intervals=last + 1)
    rows = [{"interval": n, "start_s": n * interval / 1000, "frames": bins[n][0] if n in bins else 0,
             "bytes": bins[n][1] if n in bins else 0} for n in range(last + 1)]
    total = sum(counts[0] for counts in bins.values())  # every bin is one of the rows'
    result: StatsAnswer = {"method": "sharkd frames (frame.time_relative, frame.len) binned as tshark's io,stat",
                           "interval_ms": interval, "rows": rows, "frames": total,
                           "bytes": sum(counts[1] for counts in bins.values())}
    if not total:
        result["reason"] = message.why_empty(())
    return result


def _microseconds(seconds: str) -> int:
    """A relative time in whole microseconds as the tap computes it: secs * 10^6 + (nsecs + 500) / 1000,
    C division truncating toward zero (both parts carry the sign of a negative time)."""
    ns = _nanoseconds(seconds)
    secs = abs(ns) // 1_000_000_000 * (1 if ns >= 0 else -1)
    nsecs = ns - secs * 1_000_000_000
    rounded = nsecs + 500
    return secs * 1_000_000 + (abs(rounded) // 1000) * (1 if rounded >= 0 else -1)


def _nanoseconds(seconds: str) -> int:
    whole, _, fraction = seconds.strip().partition(".")
    sign = -1 if whole.startswith("-") else 1
    return sign * (abs(int(whole or "0")) * 1_000_000_000 + int((fraction + "000000000")[:9]))


async def _native_srt(capture: CaptureSession, request: Request, message: Stats) -> StatsAnswer:
    name = NATIVE_SRT[message.protocol or ""]
    rows = []
    for table in (await _tap(capture, request, name)).get("tables", []):
        for r in table.get("r", []):
            num = int(r["num"])
            rows.append({"procedure": r["n"], "count": num, "min_s": r["min"], "max_s": r["max"],
                         "avg_s": round(r["tot"] / num, 9) if num else None, "sum_s": r["tot"],
                         "table": table.get("n")})
    return {"method": f"sharkd tap {name} (Wireshark's SRT: answers paired with requests by hop-by-hop and "
                      "end-to-end identifier on the connection)", "rows": rows}
