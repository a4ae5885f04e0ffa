"""Columns or fields of the frames a display filter matches, read from an indexed capture without loading
it: tshark two-pass (the capture's own command) over a cut of the frames carrying some layers and what
their dissection depends on (query.records_carrying: their TCP streams whole, their IP ends' other frames
and fragments). Columns as the loaded capture's sharkd shows them: sharkd's columns `<field>:<occurrence>`
are custom columns, and so are these (`%Cus:<field>:<occurrence>:R`), the same text (a message type by
its name, a number as Wireshark resolves it); fields as `tshark -T fields` prints them of a whole file.

Frame numbers are the whole file's. What depends on the frames before it is the cut's own: relative times
(their differences are the whole file's), Wireshark's stream and session numbering. Each frame read must
carry the index's layers (query.differing_layers). A file that cannot be cut, a cut read otherwise, or
tshark past the cut's memory or time bound (workspace.bounded_head): NOT_FOUND with `index_unanswered` (the
loaded capture answers); the first two hold for good (Lasting), the bounds may pass on a quieter machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from diagd.actors.pcap.index import narrow, query, workspace
from diagd.actors.pcap.shark.tshark import AGGREGATOR, FIELDS_OPTIONS, filter_refusal
from diagd.actors.pcap.shark.wireshark import COLUMN_PREFIX, column_format_pref
from diagd.protocol.errors import DiagdError, ErrorCode


class Lasting(DiagdError):
    """A refusal that holds for good for this file and question: the file cannot be cut (narrow.Uncuttable),
    or frames cut from it are dissected otherwise than in the whole file. Never read again (readings.py)."""


@dataclass(frozen=True)
class Columns:
    """What is read of each frame: sharkd's column specs (`field:occurrence`), shown as sharkd shows them."""

    specs: tuple[str, ...]

    def names(self) -> list[str]:
        return [spec.rsplit(":", 1)[0] for spec in self.specs]

    def printing(self) -> list[str]:
        titles = {f"cut{i}": "%Cus:{}:{}:R".format(*spec.rsplit(":", 1)) for i, spec in enumerate(self.specs)}
        return ["-o", column_format_pref(titles), "-T", "fields", "-E", "header=n", "-e", "frame.number",
                *(a for title in titles for a in ("-e", COLUMN_PREFIX + title)), "-e", "frame.protocols"]


@dataclass(frozen=True)
class Fields:
    """What is read of each frame: tshark fields' values (`-T fields`, every occurrence joined by commas, as
    tshark.fields_argv reads them of a whole file); `numbered`: those holding frame numbers (links to
    other frames), turned into the whole file's."""

    names_read: tuple[str, ...]
    numbered: tuple[str, ...] = ()

    def names(self) -> list[str]:
        return list(self.names_read)

    def printing(self) -> list[str]:
        return [*FIELDS_OPTIONS, "-e", "frame.number", *(a for name in self.names_read for a in ("-e", name)),
                "-e", "frame.protocols"]


async def read(capture: Path, index: Path, frames: int, argv: list[str], display_filter: str,
               wanted: Columns | Fields, layers: tuple[str, ...], on_row: Callable[[int, dict[str, str]], None], *,
               purpose: str, max_frames: int, too_many: str = "cut the capture with pcap_extract_subcapture",
               outside: str | None = None) -> int:
    """Hand each frame of `capture` (its index at `index`, `frames` frames; `argv`: its own two-pass tshark
    command) that `display_filter` matches to `on_row`, in frame order: its whole-file number and what is
    `wanted` of it by field name, read from a cut of the frames carrying `layers`; returns how many frames
    were cut (`outside`: a layer inside that protocol, a tunnel's payload, does not choose a frame; the
    filter still reads every frame cut). More than `max_frames` matches: OUTPUT_TOO_LARGE, saying what to
    do (`too_many`); a filter tshark refuses: INVALID_FILTER. `purpose` ("pair SIP messages") names what
    the index could not do when it cannot."""
    records = await trio.to_thread.run_sync(query.records_carrying, index, layers, outside)
    numbers = [number for number, _ in records]
    names = wanted.names()
    numbered = wanted.numbered if isinstance(wanted, Fields) else ()
    read_numbers: list[int] = []
    read_layers: list[str] = []

    def take(line: str) -> None:
        cells = line.rstrip("\n").replace(AGGREGATOR, ",").split("\t")
        if len(cells) != len(names) + 2 or not cells[0].isdigit():
            return
        number = numbers[int(cells[0]) - 1]
        read_numbers.append(number)
        read_layers.append(cells[-1])
        row = dict(zip(names, cells[1:-1], strict=True))
        for name in numbered:
            if row.get(name):
                row[name] = ",".join(str(numbers[int(n) - 1]) for n in row[name].split(","))
        on_row(number, row)

    try:
        async with workspace.cut_beside(capture, index, [off for _, off in records], frames) as cut:
            done = await workspace.bounded_head(
                [*workspace.reading(argv, cut), "-Y", display_filter, *wanted.printing()], len(records), purpose,
                max_frames + 1, max_line=1 << 24, on_line=take)
    except narrow.Uncuttable as exc:
        raise Lasting(ErrorCode.NOT_FOUND, f"the index cannot {purpose}: {exc}", index_unanswered=True) from None
    if done.stopped:
        raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE, f"more than {max_frames} frames match {display_filter!r} "
                         f"(each held for the answer): {too_many}", limit=max_frames)
    if done.returncode != 0:
        if (refusal := await filter_refusal(display_filter)) is not None:
            raise DiagdError(ErrorCode.INVALID_FILTER, refusal, display_filter=display_filter)
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"tshark over the frames cut failed: {done.stderr[-500:]}")
    differing = await trio.to_thread.run_sync(query.differing_layers, index, read_numbers, read_layers)
    if differing:
        raise Lasting(ErrorCode.NOT_FOUND,
                      f"the index cannot {purpose}: frames cut from the capture dissected otherwise than in the "
                      f"whole file (first: {', '.join(map(str, differing))})", frames=differing,
                      index_unanswered=True)
    return len(records)
