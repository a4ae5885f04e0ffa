"""Packet-list rows and tshark -T fields cells as the tools return them, and the tshark arguments that print them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.shark.wireshark import (
    COLUMN_FIELDS,
    COLUMN_FORMATS,
    COLUMN_PREFIX,
    column_format_pref,
)

DEFAULT_COLUMNS = ("number", "time_relative", "src", "dst", "protocol", "length", "info")
DEFAULT_COLUMN_PREF = column_format_pref()  # the default packet-list columns, as one `-o` value


def fields_filter(fields: list[str] | tuple[str, ...]) -> str:
    """pcap_timeline's filter when none is given: frames holding any of the fields. Columns (_ws.col.*)
    and frame.number are no display-filter fields: they cannot narrow it ("" when only they are asked)."""
    return " || ".join(f for f in fields if f != "frame.number" and not f.startswith(COLUMN_PREFIX))


def field_value(name: str, text: str) -> Any:
    """One cell of `tshark -T fields`: null when empty, a list when the field occurs several times
    (a column is one text and is never split)."""
    if text == "":
        return None
    if name.startswith(COLUMN_PREFIX):
        return text
    values = text.split(_cold.AGGREGATOR)
    return values[0] if len(values) == 1 else values


def packet_row(c: list[str]) -> dict[str, Any]:
    """A packet-list row from sharkd's default columns. A file type without timestamps or lengths
    (wiretap reads some odd formats) leaves those columns empty: they become null, not a crash."""
    def number(text: str, kind: Callable[[str], Any]) -> Any:
        try:
            return kind(text)
        except ValueError:
            return None

    return dict(zip(DEFAULT_COLUMNS, [number(c[0], int), number(c[1], float), c[2], c[3], c[4], number(c[5], int),
                                      c[6].strip()], strict=True))


def packet_list_command(display_filter: str) -> list[str]:
    """The tshark arguments that print pcap_frames_by_filter's rows: the default columns, by name."""
    return [*(["-Y", display_filter] if display_filter else []), "-o", DEFAULT_COLUMN_PREF, "-T", "fields",
            "-E", "header=n", *[a for name in COLUMN_FIELDS for a in ("-e", name)]]


def packet_file_command(display_filter: str, columns: list[dict[str, str]], include_default: bool) -> list[str]:
    """The tshark arguments that print pcap_packet_list's rows: the same columns defined with -o
    (extra fields as custom columns showing every occurrence, resolved, as the worker's do)."""
    defined = dict(COLUMN_FORMATS) if include_default else {}
    for index, col in enumerate(columns, start=1):
        defined[f"extra{index}"] = f"%Cus:{col['field']}:0:R"  # its own title: any name stays quotable
    return [*(["-Y", display_filter] if display_filter else []), "-o", column_format_pref(defined), "-T", "fields",
            "-E", "header=n", *[a for title in defined for a in ("-e", COLUMN_PREFIX + title)]]


def sort_key(value: Any) -> tuple[int, float, str]:
    first = value[0] if isinstance(value, list) and value else value
    if first is None:
        return (2, 0.0, "")
    try:
        return (0, float(int(first, 0)) if isinstance(first, str) and first.startswith("0x") else float(first), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(first))

