"""pcap's diagd_timeline adapter: a capture's frames, read through pcap_timeline, as timeline rows.

The path may be a reference (`capture:<id>`, a live capture: its frames so far, the note says up to which).
Options: `filter` (a display filter, joined with the time window), `fields` (default the protocol
and info columns) and `decode_as`, as pcap_timeline takes them.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from diagd.actors import timeline_source as ts
from diagd.actors.timeline_source import Caller, Read, Source, TimelineSource, Window
from diagd.protocol.errors import DiagdError, ErrorCode

DEFAULT_FIELDS = ("_ws.col.Protocol", "_ws.col.Info")
OPTIONS = ("filter", "fields", "decode_as")


def parse(item: dict[str, Any], path: str) -> dict[str, Any]:
    fields = item.get("fields", list(DEFAULT_FIELDS))
    if not (isinstance(fields, list) and fields and all(isinstance(f, str) for f in fields)):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}.fields: a non-empty list of field names",
                         path=f"{path}.fields")
    if "filter" in item:
        _check_filter_stands_alone(item["filter"], f"{path}.filter")
    return {**{k: item[k] for k in OPTIONS if k in item}, "fields": fields}


def _check_filter_stands_alone(text: Any, path: str) -> None:
    """A capture's filter is joined with the time window as `(filter) && window`: one that closes the
    parenthesis itself (`a) || (1`) would take the window's frames out of the `&&` and spend the source's
    row cap on frames outside it. Its parentheses, outside string literals, must balance."""
    if not isinstance(text, str):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: a display filter string", path=path)
    depth, quoted, escaped = 0, False, False
    for char in text:
        if quoted:
            escaped, quoted = (False, True) if escaped else (char == "\\", char != '"')
            continue
        if char == '"':
            quoted = True
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
    if depth != 0 or quoted:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: unbalanced parentheses or quotes in {text[:200]!r}",
                         path=path)


async def read(call: Caller, source: Source, window: Window) -> Read:
    fields = [f for f in source.options["fields"] if f not in ("frame.number", "frame.time_epoch")]
    parts = [f"({source.options['filter']})"] if source.options.get("filter") else []
    # The window goes into the display filter (tshark skips what is outside), in the capture's own clock
    # and half a microsecond wider: rows say times rounded to the microsecond, and a time taken from a
    # row must select that row. The rounded times are checked against the window below.
    if window.start is not None:
        parts.append(f"frame.time_epoch >= {window.start - source.shift_s - 5e-7:.7f}")
    if window.end is not None:
        parts.append(f"frame.time_epoch <= {window.end - source.shift_s + 5e-7:.7f}")
    args: dict[str, Any] = {"pcap_path": source.ref, "fields": ["frame.time_epoch", *fields],
                            "display_filter": " && ".join(parts) or "frame", "limit": ts.SOURCE_CAP}
    if "decode_as" in source.options:
        args["decode_as"] = source.options["decode_as"]
    page = await call("pcap_timeline", args)
    out = Read(cut=bool(page.get("has_more")))
    for frame in page["rows"]:
        epoch = frame.get("frame.time_epoch")
        if not epoch:
            continue
        shown = ts.row(source, float(epoch), frame=frame["frame.number"], fields={f: frame.get(f) for f in fields})
        if window.holds(shown["t"]):
            out.rows.append(shown)
    out.rows.sort(key=lambda r: r["t"])  # frames are in file order, which may not be time order
    if not out.rows:
        out.note = f"no frame matched {args['display_filter']!r}"
    live = page.get("source", {}).get("live")
    if live:  # a `capture:<id>` reference: how far the capture had got
        out.note = f"{out.note}; {live['note']}" if out.note else live["note"]
    return out


SOURCE = TimelineSource(read, rows="capture frames", names="path", example="core.pcap", options=OPTIONS,
                        parse=parse, label=lambda ref: PurePath(ref).name)
