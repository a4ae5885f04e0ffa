"""How a back end's records are read for diagd_timeline: the adapter it declares, and what adapters share.

diagd_timeline (daemon/server/timeline.py) merges rows of several sources by wall-clock time; a source of
kind K (`{"K": ref, ...}` in its `sources`) is read by the adapter the back end named K declared
with `Runtime.add_timeline_source`. The adapter reads through the back end's own tools, by name,
via a `Caller` (validation, limits, audit and the client's tool groups as for any call), so a tool
and the adapter that reads it change together, in one package; the daemon knows neither.

Each source is read up to `SOURCE_CAP` rows inside the window (`Read.cut` when there were more).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

SOURCE_CAP = 5000  # rows read per source and call (read as `timeline_source.SOURCE_CAP`: tests lower it)
MAX_EPOCH_S = 253402300799  # 9999-12-31T23:59:59Z

# A tool call by name: its result, or the DiagdError it answered.
Caller = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class Source:
    kind: str  # the back end's name
    ref: str  # what the back end names one by: a capture path, a port, an execution or session id
    label: str
    shift_s: float
    options: dict[str, Any]


@dataclass
class Read:
    """What one source gave: its rows (times already shifted) and whether it was cut at the cap."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    cut: bool = False
    note: str | None = None


class Window:
    """The merged time range asked for (shifted time); each source sees it in its own clock."""

    def __init__(self, start: float | None, end: float | None) -> None:
        if start is not None and end is not None and end < start:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "end is before start", start=start, end=end)
        self.start, self.end = start, end

    def holds(self, t: float) -> bool:
        return (self.start is None or t >= self.start) and (self.end is None or t <= self.end)

    def past(self, t: float) -> bool:
        return self.end is not None and t > self.end


def row(source: Source, t_own: float, **info: Any) -> dict[str, Any]:
    """One merged row: the source's own time `t_own` shifted by its offset, as `t` and ISO `time`."""
    micros = round((t_own + source.shift_s) * 1_000_000)
    seconds, fraction = divmod(micros, 1_000_000)
    if abs(seconds) > MAX_EPOCH_S:  # a crafted pcapng's 64-bit timestamp, shifted: no ISO time for it
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"a row's time ({micros / 1_000_000} s, offset applied) is "
                         f"beyond {MAX_EPOCH_S} s (year 9999) from 1970: check the source's clock and offset_ms",
                         t=micros / 1_000_000)
    # Rounded to the microsecond once, so `t` and `time` say the same instant (utc.iso truncates a float).
    return {"t": micros / 1_000_000, "time": f"{utc.iso(seconds)[:-1]}.{fraction:06d}Z", "source": source.label,
            **info}


def _own_options(options: tuple[str, ...]) -> Callable[[dict[str, Any], str], dict[str, Any]]:
    return lambda item, path: {k: item[k] for k in options if k in item}


@dataclass(frozen=True)
class TimelineSource:
    """A back end's adapter for diagd_timeline: how one `sources` entry of its kind is read.

    `read` pages the back end's own tools through the `Caller`; the entry's keys other than the kind,
    `offset_ms` and `label` are `options` (anything else is refused with a close match), which
    `parse` may check and complete (called with the entry and its JSON path, e.g. "$.sources[0]";
    by default the options given are taken as they are).
    """

    read: Callable[[Caller, Source, Window], Awaitable[Read]]
    rows: str  # what its rows are, for the instructions: "capture frames"
    names: str  # what a reference names, for the tool's schema: "path", "port", "id"
    example: str  # a reference, for a refusal's example: "core.pcap"
    options: tuple[str, ...] = ()
    parse: Callable[[dict[str, Any], str], dict[str, Any]] | None = None
    label: Callable[[str], str] = str  # a source's default label is "<kind>:<label(ref)>"

    def parse_options(self, item: dict[str, Any], path: str) -> dict[str, Any]:
        return (self.parse or _own_options(self.options))(item, path)
