"""Answers to most pcap questions (frame text and search: text.py), built from one loaded capture.

Each runs inside the actor's call, reading the capture through its session's primitives
(session.py: `sharkd_call`, `page`, `matching`, `tree`, `analysed`); `frames` and `protocols_hint`
take only what was fetched. None of them sees the actor.
"""

from __future__ import annotations

import os
import re
from typing import Any

import trio

from diagd.actors.base import Request
from diagd.actors.pcap import ngap as ngap_summary
from diagd.actors.pcap.answer_types import (
    ExportAnswer,
    FollowAnswer,
    FramesAnswer,
    InfoAnswer,
    PacketListAnswer,
    TimelineAnswer,
)
from diagd.actors.pcap.answers import follow as _follow
from diagd.actors.pcap.engine.passes import Page
from diagd.actors.pcap.engine.pool import CaptureState
from diagd.actors.pcap.engine.session import CaptureSession, check_length
from diagd.actors.pcap.messages import Export, Follow, Frames, PacketList, Timeline
from diagd.actors.pcap.ngap.pdus import FRAMES_FILTER
from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.shark.rows import field_value, sort_key
from diagd.actors.pcap.shark.wireshark import Catalogue
from diagd.actors.pcap.warm import first_page
from diagd.protocol.errors import DiagdError, ErrorCode

INTERESTING_PROTOCOLS = ("ngap", "nas-5gs", "sctp", "s1ap", "nas-eps", "gtpv2", "pfcp", "gtp", "sip", "diameter",
                         "http2", "http", "json", "dns", "tcp", "udp")
MAX_SORTED_ROWS = 20000
INFO_WAIT_S = 1.0  # how long pcap_info waits for a fresh capture's protocol summary before answering without it
# Above this the summary's pass cannot end within INFO_WAIT_S (it builds every frame's tree: 55 MB takes
# 3-7 s on 2 cores), so pcap_info answers at once, not a second later without it all the same.
QUICK_INFO_BYTES = 8 * 2**20

TREE_BATCH = 100  # frame trees fetched per pipelined sharkd batch (sharkd dissects while this process decodes)


def info_wait_s(size: int) -> float:
    """How long pcap_info waits for a fresh capture's protocol summary (and SBI port probe)."""
    return INFO_WAIT_S if size <= QUICK_INFO_BYTES else 0.0


def not_read_yet(warnings: list[str] | None = None) -> InfoAnswer:
    """pcap_info's answer before the protocols are read: the count and span (the handler's) alone."""
    return {"sharkd_frames": None, "served_by": "capinfos (protocols still being read: call again)",
            "protocols_ready": False, "has_protocols": {}, "protocols": [], "top_conversations": [],
            "warnings": warnings or []}


async def info(capture: CaptureSession, request: Request) -> InfoAnswer:
    """Protocols and conversations; the count and time span come from capinfos (the handler).
    While sharkd loads, one tshark pass beside it reads them (started once, shared by every call);
    a call waits for it at most INFO_WAIT_S (not at all above QUICK_INFO_BYTES), then answers without
    them: protocols_ready: false."""
    served_by = "sharkd"
    if capture.state is CaptureState.LOADING:
        summary = capture.cold_summary()
        async with capture.load_progress(request):  # how far sharkd is, in the same units as every wait
            if wait_s := info_wait_s(capture.spec.size):
                with trio.move_on_after(wait_s):
                    await summary.done.wait()
            else:
                await capture.tell_load(request)  # answered at once: the load's progress said once
                capture.end_head_start()
        if not summary.done.is_set():
            return not_read_yet([capture.tshark_only.message] if capture.tshark_only is not None else [])
        cold = await summary.wait()
        protocols = list(cold["protocols"])
        conversations = cold["conversations"]
        frame_count = None
        warnings = cold["warnings"]
        served_by = "tshark (capture still loading)"
        if capture.tshark_only is not None:
            served_by = "tshark (sharkd not started: over max_memory_mb)"
            warnings = [*warnings, capture.tshark_only.message]
    else:
        analysis, taps = await capture.analysed_and_conversations(request)
        protocols = list(analysis.get("protocols", []))
        frame_count = capture.frame_count
        warnings = [capture.load_warning] if capture.load_warning else []
        conversations = []
        for tap in taps.get("taps", []):
            for conv in tap.get("convs", []):
                conversations.append({
                    "proto": tap.get("proto"),
                    "a": f"{conv['saddr']}" + (f":{conv['sport']}" if "sport" in conv else ""),
                    "b": f"{conv['daddr']}" + (f":{conv['dport']}" if "dport" in conv else ""),
                    "frames": conv["rxf"] + conv["txf"],
                    "bytes": conv["rxb"] + conv["txb"],
                })
    order = {"SCTP": 0, "TCP": 1, "UDP": 2, "IPv4": 3}
    conversations.sort(key=lambda c: (order.get(str(c["proto"]), 9), -c["frames"]))
    result: InfoAnswer = {
        "sharkd_frames": frame_count,
        "served_by": served_by,
        "protocols_ready": True,
        "has_protocols": {p: (p in protocols) for p in INTERESTING_PROTOCOLS},
        "protocols": protocols,
        "top_conversations": conversations[:10],
        "warnings": warnings,
    }
    if served_by != "sharkd":
        note = PROVISIONAL_INFO if capture.tshark_only is None else PROVISIONAL_INFO.split("; the same call")[0]
        result |= {"provisional": ["protocols", "top_conversations"], "note": note}
    return result


# What a loaded capture's answer may change of one read while sharkd loads; has_protocols, the count
# and the time span do not (tests/e2e/test_pcap_info_loading.py compares both on every capture).
PROVISIONAL_INFO = ("read by tshark while sharkd loads: sharkd's protocol list may differ in order or in "
                    "pkcs-1 (X.509); conversation bytes are cut to whole kB/MB as tshark prints them, and "
                    "a conversation set up by signalling (SDP) may count other frames; the same call after "
                    "the load gives sharkd's")


async def frames_while_loading(capture: CaptureSession, request: Request, message: Frames
                               ) -> tuple[int, list[dict[str, Any]]]:
    """(total, page) of the first question while sharkd loads: one tshark pass beside it (its
    frame numbers kept in the session's filter cache); progress is the load's meanwhile."""
    display_filter, limit, offset, filters = message.display_filter, message.limit, message.offset, capture.filters
    async with capture.load_progress(request):
        all_rows = await _cold.frames(capture.cold_argv(), display_filter)
    filters[display_filter] = [r["number"] for r in all_rows]
    return len(all_rows), all_rows[offset:offset + limit]


def frames(message: Frames, page: Page, present: list[str] | None, cat: Catalogue | None,
           sbi: str | None = None) -> FramesAnswer:
    """The answer of pcap_frames_by_filter from what the actor fetched (`present`: the capture's
    protocols, fetched only when nothing matched). A first page that came before the full pass has
    a lower bound for its total: `total_exact` says which it is."""
    result: FramesAnswer = {"total": page.total, "total_exact": page.exact, "exact": page.rows_exact,
                              "frames": page.rows, "has_more": message.offset + len(page.rows) < page.total,
                              "served_by": page.served_by}
    if not page.exact:
        result["total_at_least"] = page.total
    if not page.rows_exact:
        result["note"] = ("the capture is still loading: rows from a single tshark pass; the columns a row lists "
                          "in `provisional` may still change with later frames (e.g. \"(reply in N)\"), the rest "
                          "is exact; the same call again returns sharkd's exact page")
    elif not page.exact:
        result["note"] = (f"first page found by a tshark pass stopped after {page.total} matches; the exact total "
                          "and the later pages come from sharkd's full pass: the same call again returns the "
                          "exact total")
    if not page.total and message.display_filter:
        result["hint"] = protocols_hint(message.display_filter, present or [], cat, sbi)
    elif not page.rows and (why := empty_page(message.display_filter, page.total, message.offset, page.exact)):
        result["hint"] = why
    return result


def empty_page(display_filter: str, total: int, offset: int, exact: bool = True) -> str | None:
    """Why a page holds no row, when it is not a filter that matched nothing (protocols_hint says why
    then): a capture without frames, or an offset past the last match. None: the page is not empty."""
    if not total and not display_filter:
        return "the capture holds no frames"
    if total and offset >= total:
        matching = "frames matching the filter" if display_filter else "frames"
        counted = f"{total} {matching}" + ("" if exact else " found so far (the same call again counts them)")
        return f"offset {offset} is past the last of the {counted}: a page starts at an offset below {total}"
    return None


async def absent_protocols_hint(capture: CaptureSession, request: Request, display_filter: str) -> str:
    protocols = list((await capture.analysed(request)).get("protocols", []))
    sbi = await capture.sbi_hint() if needs_sbi_hint(display_filter, protocols) else None
    return protocols_hint(display_filter, protocols, capture.cat, sbi)


def needs_sbi_hint(display_filter: str, protocols: list[str]) -> bool:
    """Whether an empty answer's hint needs what the TCP conversations carry (decode_check.py)."""
    return "http2" in re.findall(r"[A-Za-z0-9_\-]+", display_filter) and "http2" not in protocols


def protocols_hint(display_filter: str, protocols: list[str], cat: Catalogue | None, sbi: str | None = None) -> str:
    """Why a filter matched nothing: which of its protocols the capture has at all. `sbi`: where the
    TCP conversations carry HTTP/2 or HTTP/1.1 (decode_check.http2_hint), when HTTP/2 is wanted."""
    present = set(protocols)
    tokens = {t.split(".")[0] for t in re.findall(r"[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*",
                                                    display_filter)}
    aliases = {"nas_5gs": "nas-5gs", "nas_eps": "nas-eps"}
    known = cat.protocols if cat else {}
    candidates = sorted({aliases.get(t, t) for t in tokens if aliases.get(t, t) in known})
    missing = [p for p in candidates if p not in present]
    there = [p for p in candidates if p in present]
    parts = []
    if missing:
        parts.append(f"not in this capture at all: {', '.join(missing)}")
    if there:
        parts.append(f"present in the capture but no frame matches the whole filter: {', '.join(there)}")
    if "nas-5gs" in missing or "nas-5gs" in there:
        parts.append("NAS after Security Mode Command needs preferences nas-5gs.null_decipher=TRUE "
                     "(profile 5gc-lab)")
    if "http2" in missing:
        parts.append(sbi or "HTTP/2 on a port tshark does not know needs a decode-as rule: pcap_info's "
                            "sbi_ports says which port carries it and which rule shows it")
    return "; ".join(parts) or "no frame matches"


async def timeline(capture: CaptureSession, request: Request, message: Timeline) -> TimelineAnswer:
    """Rows of field values from `tshark -T fields` itself, so they are what it prints.

    The protocol tree's filter strings are not: bytes come colon-separated and cut short, hex
    integers unpadded, some enumerations by name, absolute times in another format. The warm
    worker still gives the matching frames (total, hint) from memory; tshark reads only as far
    as the page needs unless sort_by needs every row.
    """
    display_filter, fields, limit, offset, sort_by = (message.display_filter, message.fields, message.limit,
                                                  message.offset, message.sort_by)
    single_pass = not sort_by and first_page.loading_safe(display_filter, offset, limit, message.kinds)
    if single_pass and capture.state is CaptureState.LOADING:
        early = await timeline_while_loading(capture, message)
        if early is not None:
            return early
    elif single_pass and capture.first_before_count("timeline", display_filter):
        # A filter whose frame set sharkd has not counted: its full pass is not waited for (the
        # values are exact; the total is a lower bound), the same call again counts it.
        early = await timeline_while_loading(capture, message, loaded=True)
        if early is not None:
            return early
    counted = capture.counted(display_filter) if not sort_by else None
    if counted:  # the total is known (a page's pass counted it): the rows need no frame list
        numbers: list[int] | range = range(counted)  # only its length and emptiness are read below
    else:
        numbers = await capture.matching(request, display_filter)
    if sort_by and len(numbers) > MAX_SORTED_ROWS:
        raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE,
                         f"sort_by needs every matching frame: {len(numbers)} match, the limit is "
                         f"{MAX_SORTED_ROWS}; narrow display_filter or drop sort_by", total=len(numbers))
    rows: list[dict[str, Any]] = []
    if numbers and (sort_by or offset < len(numbers)):
        extra = [f for f in fields if f != "frame.number"]
        # Single pass when it prints the same: then tshark stops at the page instead of reading the
        # whole capture once before its first row.
        argv = _cold.fields_argv(capture.tshark_argv(message.kinds), display_filter, ["frame.number", *extra])
        cells = await _cold.field_rows(argv, None if sort_by else offset + limit, run=capture.run_head)
        rows = [timeline_row(extra, row) for row in cells]
    if sort_by:
        rows.sort(key=lambda r: sort_key(r.get(sort_by)))
    rows = rows[offset:offset + limit]
    result: TimelineAnswer = {"total": len(numbers), "total_exact": True, "rows": rows,
                              "has_more": offset + len(rows) < len(numbers)}
    if not numbers and display_filter:
        result["hint"] = await absent_protocols_hint(capture, request, display_filter)
    elif not rows and (why := empty_page(display_filter, len(numbers), offset)):
        result["hint"] = why
    return result


async def timeline_while_loading(capture: CaptureSession, message: Timeline, *,
                                 loaded: bool = False) -> TimelineAnswer | None:
    """A timeline page from one early-stopping single pass: beside the load of a fresh capture, or
    (`loaded`) before sharkd's pass over a filter it has not counted. Its filter and fields are
    single-pass safe, so the values are exact; the total is a lower bound until the full pass. None
    when nothing matched: the hint needs the loaded capture."""
    check_length(message.display_filter)
    extra = [f for f in message.fields if f != "frame.number"]
    argv = _cold.fields_argv(first_page.single_pass(capture.cold_argv()), message.display_filter,
                             ["frame.number", *extra])
    cells, complete = await first_page.early_fields(argv, message.display_filter, message.offset + message.limit,
                                                    run=capture.run_head)
    capture.end_head_start()
    if not cells:
        return None
    rows = [timeline_row(extra, row) for row in cells[message.offset:]]
    seen = len(cells) if complete else len(cells) + 1
    result: TimelineAnswer = {"total": seen, "total_exact": complete, "rows": rows,
                              "has_more": message.offset + len(rows) < seen,
                              "served_by": "tshark (single pass before sharkd's count; the same call again "
                                           "counts every match)" if loaded else
                              "tshark (single pass while sharkd loads)"}
    if not complete:
        result["total_at_least"] = seen
    if not rows and (why := empty_page(message.display_filter, seen, message.offset, complete)):
        result["hint"] = why
    return result


def timeline_row(extra: list[str], cells: list[str]) -> dict[str, Any]:
    cells = cells + [""] * (len(extra) + 1 - len(cells))
    row: dict[str, Any] = {"frame.number": int(cells[0].split(_cold.AGGREGATOR)[0])}
    for name, text in zip(extra, cells[1:], strict=False):
        row[name] = field_value(name, text)
    return row


async def follow(capture: CaptureSession, request: Request, message: Follow) -> FollowAnswer:
    return await _follow.answer(capture, request, message)


async def packet_list(capture: CaptureSession, request: Request, message: PacketList) -> PacketListAnswer:
    display_filter, columns, output_path = message.display_filter, message.columns, message.output_path
    await capture.check_filter(request, display_filter)  # loaded first: column_formats come from the loaded worker
    if not capture.column_formats:  # no filter to check (all frames) and the capture still loading: wait for it
        await capture.sharkd_call(request, "status")
    params: dict[str, Any] = {}
    names: list[str] = []
    index = 0
    if message.include_default_columns:
        for fmt, name in (("%m", "No."), ("%t", "Time"), ("%s", "Source"), ("%d", "Destination"),
                          ("%p", "Protocol"), ("%L", "Length"), ("%i", "Info")):
            params[f"column{index}"] = str(capture.column_formats[fmt])
            names.append(name)
            index += 1
    for col in columns:
        params[f"column{index}"] = f"{col.field}:0"
        names.append(col.name)
        index += 1
    if display_filter:
        params["filter"] = display_filter
    rows = await capture.sharkd_call(request, "frames", params)
    table = [[str(v).replace("\t", " ").replace("\n", " ").strip() for v in r["c"]] for r in rows]

    def write() -> int:
        with open(output_path, "w", encoding="utf-8") as f:
            f.write("\t".join(names) + "\n")
            for row in table:
                f.write("\t".join(row) + "\n")
        return os.path.getsize(output_path)

    size = await trio.to_thread.run_sync(write)
    return {"output_path": output_path, "rows_written": len(table), "file_size_bytes": size,
            "columns": names, "preview_rows": [dict(zip(names, r, strict=True)) for r in table[:message.preview_rows]]}


async def export(capture: CaptureSession, message: Export) -> ExportAnswer:
    """The frames matching the filter as a new pcapng file, written by tshark -w (from the file, not
    the worker: it needs no loaded capture)."""
    packets = await _cold.export(capture.cold_argv(), message.display_filter, message.output_path)
    size = (await trio.Path(message.output_path).stat()).st_size
    return {"output_path": message.output_path, "packet_count": packets, "file_size_bytes": size,
            "display_filter": message.display_filter}


async def core_rows(capture: CaptureSession) -> list[dict[str, str]]:
    """PFCP and SBI rows for linking to PDU session establishments (tshark -T fields, two-pass for
    pfcp.response_in / http.response_in); occurrences joined by commas."""
    fields = ngap_summary.CORE_FIELDS
    argv = _cold.fields_argv(capture.cold_argv(), ngap_summary.CORE_FILTER, fields)
    return [{name: cell.replace(_cold.AGGREGATOR, ",") for name, cell in zip(fields, cells, strict=False)}
            for cells in await _cold.field_rows(argv, None)]


async def ngap_model(capture: CaptureSession, request: Request, display_filter: str) -> ngap_summary.Model:
    """The capture's one procedure model (per display filter), built once and shared by every view."""
    model = capture.ngap_models.get(display_filter)
    if model is None:
        model = ngap_summary.build_model(await ngap_pdus(capture, request, display_filter))
        if len(capture.ngap_models) >= 8:
            capture.ngap_models.pop(next(iter(capture.ngap_models)))
        capture.ngap_models[display_filter] = model
    return model


async def ngap_pdus(capture: CaptureSession, request: Request, display_filter: str) -> list[ngap_summary.NgapPdu]:
    base = FRAMES_FILTER
    numbers = await capture.matching(request, f"({base}) && ({display_filter})" if display_filter else base)
    pdus: list[ngap_summary.NgapPdu] = []
    for start in range(0, len(numbers), TREE_BATCH):
        batch = numbers[start:start + TREE_BATCH]
        for number, answer in zip(batch, await capture.trees_of(request, batch), strict=True):
            pdus.extend(ngap_summary.pdus_in_frame(number, answer["tree"]))
    return pdus
