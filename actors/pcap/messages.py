"""What the pcap tools ask a capture's actor: one frozen dataclass per question, a `Message` of its
answer's model (answer_types.py), so the tool gets that model back from `PcapBackend.ask`.

Messages are hashable (tuples, not lists): an answer is cached under its question (`cache_key`), so
equal questions from any client share one answer.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from diagd.actors.message import Message
from diagd.actors.pcap.answer_types import (
    CheckAnswer,
    DetailAnswer,
    ExportAnswer,
    FollowAnswer,
    FramesAnswer,
    IndexAnswer,
    InfoAnswer,
    PacketListAnswer,
    PduSessionsAnswer,
    ProceduresAnswer,
    SearchAnswer,
    StatsAnswer,
    TimelineAnswer,
    UeSessionsAnswer,
)


@dataclass(frozen=True)
class Info(Message[InfoAnswer]):
    """Protocols and conversations (the count and time span come from capinfos, in the tool)."""


@dataclass(frozen=True)
class IndexStatus(Message[IndexAnswer]):
    """Where the capture's index is (building, ready, failed), waiting at most `wait_s` for its build."""

    wait_s: float = 0.0


@dataclass(frozen=True)
class Check(Message[CheckAnswer]):
    """Is this display filter valid for the capture's Wireshark?"""

    display_filter: str


@dataclass(frozen=True)
class Frames(Message[FramesAnswer]):
    display_filter: str
    limit: int
    offset: int
    # (name, type, protocol) of the filter's names (Catalogue.kinds): what a single pass may answer.
    kinds: tuple[tuple[str, str | None, str | None], ...] | None = None


@dataclass(frozen=True)
class Timeline(Message[TimelineAnswer]):
    display_filter: str
    fields: tuple[str, ...]
    limit: int
    offset: int
    sort_by: str | None
    kinds: tuple[tuple[str, str | None, str | None], ...] | None = None  # of the filter's and fields' names


@dataclass(frozen=True)
class Detail(Message[DetailAnswer]):
    frame_numbers: tuple[int, ...]
    layers: tuple[str, ...]
    restrict_layers: bool
    verbosity: str
    max_bytes: int


@dataclass(frozen=True)
class TextSearch(Message[SearchAnswer]):
    display_filter: str
    query: str
    is_regex: bool
    case_sensitive: bool
    budget_s: float  # matching time the call may spend ([daemon] regex_budget_s)
    layers: tuple[str, ...]
    restrict_layers: bool
    limit: int | None
    offset: int
    max_matches: int
    snippet_context_chars: int
    max_bytes: int
    # When the scan stops to answer in time (trio time, inside the call's timeout). A moment, not
    # part of the question: it is left out of the cache key.
    stop_at: float | None = None
    kinds: tuple[tuple[str, str | None, str | None], ...] | None = None  # of the filter's names


@dataclass(frozen=True)
class Follow(Message[FollowAnswer]):
    frame_number: int
    display_filter: str
    limit: int
    offset: int
    text_bytes: int = 0  # > 0: follow the frame's TCP or UDP stream, with its payload text (at most this many bytes)


@dataclass(frozen=True)
class Column:
    name: str
    field: str


@dataclass(frozen=True)
class PacketList(Message[PacketListAnswer]):
    display_filter: str
    columns: tuple[Column, ...]
    include_default_columns: bool
    output_path: str
    preview_rows: int


@dataclass(frozen=True)
class Export(Message[ExportAnswer]):
    """Write the frames matching `display_filter` to `output_path` (pcapng) with tshark -w."""

    display_filter: str
    output_path: str


@dataclass(frozen=True)
class NgapSessions(Message[UeSessionsAnswer]):
    display_filter: str


@dataclass(frozen=True)
class PduSessions(Message[PduSessionsAnswer]):
    display_filter: str


@dataclass(frozen=True)
class NgapProcedures(Message[ProceduresAnswer]):
    display_filter: str


@dataclass(frozen=True)
class IndexNgapSessions(Message[UeSessionsAnswer]):
    """NgapSessions from the capture's index (index/ngap_pdus.py), decoded so: the decode-as entries of
    Wireshark's config, and the preferences of the call; of the frames meeting a filter the index
    translates (index/filters.py) or of all."""

    decode_as_entries: tuple[str, ...]
    preferences: tuple[tuple[str, str], ...]
    display_filter: str = ""


@dataclass(frozen=True)
class IndexNgapProcedures(Message[ProceduresAnswer]):
    """NgapProcedures from the capture's index (index/ngap_views.py), decoded and filtered as
    IndexNgapSessions says; its PFCP and SBI rows read from a cut of the capture (index/core_rows.py)."""

    decode_as_entries: tuple[str, ...]
    preferences: tuple[tuple[str, str], ...]
    display_filter: str = ""


@dataclass(frozen=True)
class IndexPduSessions(Message[PduSessionsAnswer]):
    """PduSessions from the capture's index, decoded and filtered as IndexNgapSessions says."""

    decode_as_entries: tuple[str, ...]
    preferences: tuple[tuple[str, str], ...]
    display_filter: str = ""


@dataclass(frozen=True)
class Stats(Message[StatsAnswer]):
    """Wireshark's statistics of one kind (stats.py): every row, paged by the tool."""

    kind: str
    protocol: str | None
    display_filter: str
    interval_ms: int | None
    kinds: tuple[tuple[str, str | None, str | None], ...] | None = None  # of the filter's names (Catalogue.kinds)

    def why_empty(self, protocols: Collection[str]) -> str:
        """Why this question has no row, in the words of every path that answers it (the loaded capture's
        answers/stats.py, the index's): its protocol absent from `protocols` (the capture's), no frame
        matching its filter, or nothing of its kind in the frames there are."""
        wanted = self.protocol if self.kind in ("conversations", "endpoints", "srt") else None
        if wanted is not None and wanted not in protocols:
            return f"protocol {wanted} is not in this capture"
        if self.display_filter:
            return f"no frame matches display_filter {self.display_filter!r}"
        if self.kind == "expert":
            return "Wireshark raised no expert information on this capture"
        if self.kind == "io":
            return "the capture holds no frames"
        return f"{self.protocol} is present but carries no request/response pair"


@dataclass(frozen=True)
class IndexStats(Message[StatsAnswer]):
    """A page of a Stats question's rows from the capture's index, paged where they are kept (a
    million conversations are never read whole for a page of them); the answer says how many there are."""

    question: Stats
    offset: int
    limit: int


PcapMessage = (Info | Check | Frames | Timeline | Detail | TextSearch | Follow | PacketList | Export
               | NgapSessions | PduSessions | NgapProcedures | Stats)


def cache_key(message: object) -> object | None:
    """The key an answer to `message` is cached under; None: never cached (it writes a file)."""
    if isinstance(message, Export | PacketList):
        return None
    if isinstance(message, TextSearch):
        return replace(message, stop_at=None)
    return message
