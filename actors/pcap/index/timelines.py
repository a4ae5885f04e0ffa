"""Which pcap_timeline questions a capture's index answers: fields it holds as tshark prints them, with
their own filter (frames holding any of them) or a filter filters.py translates."""

from __future__ import annotations

from diagd.actors.pcap.index import filters
from diagd.actors.pcap.index.schema import Column, by_field
from diagd.actors.pcap.messages import Timeline
from diagd.actors.pcap.shark.rows import fields_filter

# The Time column is stored as a number: its text (the digits tshark prints) is not kept.
NOT_AS_PRINTED = frozenset({"_ws.col.Time"})


def columns(fields: tuple[str, ...]) -> list[tuple[str, Column]] | None:
    """Each field's index column, frame.number included (None: one is not in the index as printed)."""
    found = []
    for field in fields:
        col = by_field("_ws.col.No." if field == "frame.number" else field)
        if col is None or field in NOT_AS_PRINTED:
            return None
        found.append((field, col))
    return found


def where(message: Timeline) -> str | None:
    """The SQL condition of a timeline's filter: its own (frames holding any of its fields, which the
    index holds) or one filters.py translates; None: not a timeline the index answers."""
    fields = columns(message.fields)
    if fields is None:
        return None
    if message.display_filter == fields_filter(message.fields):
        present = [col for f, col in fields if f != "frame.number" and not f.startswith("_ws.col.")]
        return " OR ".join(f"{col.name} IS NOT NULL" for col in present) or "TRUE"
    return filters.to_sql(message.display_filter)
