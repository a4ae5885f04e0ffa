"""Answers from an index still being built (index/build.py closes the files of its frames table as it
goes): packet-list pages and timelines of the frames indexed so far, for a capture no other reader
answers soon (too big for sharkd, or still loading), while the rest is read.

Each row is final once written: tshark's two-pass rows are printed after its first pass has read the
whole file (or, in a chunked build, the whole chunk: a seam frame's row may still change, and which
frames are seam frames is known at the build's end, so every row of a chunked build's answer lists the
columns that may then change in `provisional`). What is not known yet is how many frames, or matches,
come after: a page is answered only when the frames indexed so far hold all of it, its total is a lower
bound (`total_exact` false, `total_at_least`) and more may follow (`has_more`). Any other page, a filter
the index does not translate, a sorted timeline: left to the loaded capture (`index_unanswered`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.actors.pcap.answer_types import FramesAnswer, TimelineAnswer
from diagd.actors.pcap.index import filters, query, timelines
from diagd.actors.pcap.messages import Frames, Timeline
from diagd.protocol.errors import DiagdError, ErrorCode

KEPT = 1_000_000  # matches' numbers held for a filtered page (query.matching: more are counted per block)
SERVED_BY = "index (being built)"


@dataclass(frozen=True)
class Building:
    """What a running build has said of itself (its progress lines)."""

    folder: Path  # the build's own folder: its closed files of the frames table are read
    indexed: int  # frames in those files (frames 1..indexed)
    chunked: bool  # read in chunks (stitch.py): seam frames unknown until the end


def frames(building: Building, message: Frames) -> FramesAnswer:
    """A packet-list page of the frames indexed so far."""
    where = _vouched(building, filters.to_sql(message.display_filter))
    if where is None:
        raise _unanswered("the filter is not one the index translates")
    with _reading():
        if message.display_filter:
            total, rows = _matching_page(building, where, message.offset, message.limit,
                                         lambda m: query.listed_page(building.folder, where, m, message.offset,
                                                                     message.limit))
        else:
            if message.offset + message.limit > building.indexed:
                raise _unanswered(f"the page ends past the {building.indexed} frames indexed so far")
            total, rows = building.indexed, query.page(building.folder, message.offset, message.limit)
    _mark(building, rows, query.SEAM_COLUMNS)
    matching = "frames matching the filter" if message.display_filter else "frames"
    return {"total": total, "total_exact": False, "total_at_least": total, "exact": not building.chunked,
            "frames": rows, "has_more": True, "served_by": SERVED_BY, "note": _note(building, total, matching)}


def timeline(building: Building, message: Timeline) -> TimelineAnswer:
    """A timeline page (fields the index holds, in frame order) of the frames indexed so far."""
    fields = timelines.columns(message.fields)
    where = _vouched(building, timelines.where(message))
    if fields is None or where is None or message.sort_by not in (None, "frame.number"):
        raise _unanswered("not a timeline the index answers in frame order")
    asked = [(f, col) for f, col in fields if f != "frame.number"]
    with _reading():
        total, rows = _matching_page(building, where, message.offset, message.limit,
                                     lambda m: query.timeline_page(building.folder, asked, where, m, message.offset,
                                                                   message.limit))
    _mark(building, rows, sorted(f for f, col in asked if col.name not in query.PER_FRAME))
    return {"total": total, "total_exact": False, "total_at_least": total, "rows": rows, "has_more": True,
            "served_by": SERVED_BY, "note": _note(building, total, "frames holding the fields or matching the filter")}


def _matching_page(building: Building, where: str, offset: int, limit: int,
                   page: Any) -> tuple[int, list[dict[str, Any]]]:
    """The frames meeting `where` (vouched: bounded to the frames indexed so far): how many, and the page
    `page` reads of them."""
    matches = query.matching(building.folder, where, KEPT)
    if offset + limit > matches.total:
        raise _unanswered(f"{matches.total} of the {building.indexed} frames indexed so far match: fewer than the "
                          "page needs")
    return matches.total, page(matches)


def _vouched(building: Building, where: str | None) -> str | None:
    """`where` held to the frames indexed so far: a chunked build's closed files may hold a chunk whose
    frame count is not checked yet (its rows not vouched for)."""
    return None if where is None else f"({where}) AND number <= {int(building.indexed)}"


def _mark(building: Building, rows: list[dict[str, Any]], may_differ: list[str]) -> None:
    if building.chunked and may_differ:
        for row in rows:
            row["provisional"] = may_differ


def _note(building: Building, total: int, counted: str) -> str:
    return (f"from the index being built: the first {building.indexed} frames of the capture are indexed so far, "
            f"{total} {counted} among them (total_at_least); each row is tshark's two-pass row, final"
            + (" unless it is a seam frame of the chunks the capture is read in (known when the build ends): "
               "`provisional` names what may then change" if building.chunked else "")
            + "; pcap_index tells when the whole capture is indexed")


class _reading:
    """A read the build's own course defeated: its folder renamed as it ended, or removed as it failed,
    between listing its files and reading them (a coded error, a file gone, DuckDB's own error). The loaded
    capture answers instead: never a traceback."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        import duckdb

        if isinstance(exc, DiagdError) and exc.details.get("index_unanswered"):
            return
        if isinstance(exc, DiagdError | OSError | duckdb.Error):
            raise _unanswered(str(exc.message if isinstance(exc, DiagdError) else exc)[:300]) from None


def _unanswered(why: str) -> DiagdError:
    return DiagdError(ErrorCode.NOT_FOUND, f"the index being built does not answer this yet: {why}",
                      index_unanswered=True)
