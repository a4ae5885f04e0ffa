"""What the pcap actor answers each message with (messages.py: `Message[SomeAnswer]`), as models.

The tool handlers (tools.py, sequence_tool.py) get these from `PcapBackend.ask` and add what the call
knows (`source`, the page asked for, ...) to make their replies (replies.py); mypy --strict checks the
answer builders (answers/, ngap/) against these and each reply built from one against its model. An
answer may carry keys a reply's model does not name (its rows stay open, as the replies' do): the
handler's own model of what it returns says so. Nested rows (frames, UE contexts, sessions, statistics)
carry what Wireshark's dissectors give and stay `dict[str, Any]`, as in the replies.
"""

from __future__ import annotations

from typing import Any, NotRequired

from typing_extensions import TypedDict


class Answered(TypedDict):
    """What the actor adds to every answer it sends (actor.py: `handle`)."""

    cached: NotRequired[bool]


class CheckAnswer(Answered):
    """The display filter is valid (an invalid one is refused with an error)."""

    valid: bool


class InfoAnswer(Answered):
    """A capture's protocols and conversations (the count and time span are capinfos', in the tool)."""

    sharkd_frames: int | None
    served_by: str
    protocols_ready: bool
    has_protocols: dict[str, bool]
    protocols: list[str]
    top_conversations: list[dict[str, Any]]
    warnings: list[str]
    provisional: NotRequired[list[str]]
    note: NotRequired[str]


class FramesAnswer(Answered):
    """A page of packet-list rows."""

    total: int
    total_exact: bool
    exact: bool
    frames: list[dict[str, Any]]
    has_more: bool
    served_by: str
    total_at_least: NotRequired[int]
    note: NotRequired[str]
    hint: NotRequired[str]


class TimelineAnswer(Answered):
    """A page of field values per matching frame."""

    total: int
    total_exact: bool
    rows: list[dict[str, Any]]
    has_more: bool
    served_by: NotRequired[str]
    total_at_least: NotRequired[int]
    hint: NotRequired[str]
    note: NotRequired[str]


class DetailFrame(TypedDict, total=False):
    frame_number: int
    """the frame"""
    protocols: list[str]
    """its protocol stack"""
    text: str
    """its decoded tree (tshark -V)"""
    truncated: bool
    """the text was cut at max_bytes"""
    layers_found: list[str] | None
    """the asked layers it has"""


class DetailAnswer(Answered):
    """The decoded text of frames."""

    frames: list[DetailFrame]
    truncated: bool
    layers_resolved: dict[str, Any] | None


class SearchMatch(TypedDict, total=False):
    frame_number: int
    """the frame"""
    match: str
    """the text matched"""
    line: str
    """the decoded line it is on"""
    snippet: str
    """the text around it"""
    provisional: list[str]
    """line/snippet may change after the full pass"""


class SearchAnswer(Answered):
    """Where a text occurs in the decoded frames."""

    frames_total: int
    frames_scanned: int
    offset: int
    complete: bool
    stopped_because: str | None
    searched_frames: list[int] | None
    next_offset: int | None
    matches: list[SearchMatch]
    match_count: int
    truncated: bool
    has_more: bool
    frames_without_layers: NotRequired[int]
    frames_ruled_out: NotRequired[int]
    total_exact: NotRequired[bool]
    total_at_least: NotRequired[int]
    exact: NotRequired[bool]
    served_by: NotRequired[str]
    note: NotRequired[str]


class FollowAnswer(Answered):
    """A frame's stream, session, call or GTPv2-C tunnel, and a page of its frames."""

    follow_type: str
    follow_key: dict[str, Any]
    followed: str
    follow_display_filter: str
    display_filter: str
    total: int
    total_exact: bool
    frames: list[dict[str, Any]]
    has_more: bool
    transaction: NotRequired[dict[str, Any]]
    text: NotRequired[dict[str, Any]]
    hint: NotRequired[str]


class PacketListAnswer(Answered):
    """The packet-list TSV written."""

    output_path: str
    rows_written: int
    file_size_bytes: int
    columns: list[str]
    preview_rows: list[dict[str, Any]]


class ExportAnswer(Answered):
    """The subcapture written."""

    output_path: str
    packet_count: int
    file_size_bytes: int
    display_filter: str


class UeSessionsAnswer(Answered):
    """NGAP UE contexts, their links and the NG associations (ngap_ue_sessions' contexts view)."""

    ue_count: int
    ues: list[dict[str, Any]]
    failed_ues: list[dict[str, Any]]
    associations: list[dict[str, Any]]
    linked_ue_groups: list[dict[str, Any]]
    not_linked: list[Any]
    non_ue_failures: list[dict[str, Any]]
    ngap_pdus: int
    warnings: list[str]
    served_by: NotRequired[str]  # set by the tool when the capture's index gave the model
    reason: NotRequired[str]


class ProceduresAnswer(Answered):
    """NGAP and NAS procedures per UE context, with latencies (ngap_ue_sessions' procedures view)."""

    ue_count: int
    procedure_count: int
    ues: list[dict[str, Any]]
    non_ue_procedures: list[dict[str, Any]]
    statistics: dict[str, Any]
    failed: list[dict[str, Any]]
    incomplete: int
    associations: list[dict[str, Any]]
    ngap_pdus: int
    percentiles: str
    warnings: list[str]
    n4_sbi: dict[str, Any]
    served_by: NotRequired[str]  # set by the tool when the capture's index gave the model
    reason: NotRequired[str]
    # The contexts view's keys, which this view never has: ngap_ue_sessions has one reply model for both.
    failed_ues: NotRequired[list[dict[str, Any]]]
    linked_ue_groups: NotRequired[list[dict[str, Any]]]
    not_linked: NotRequired[list[Any]]
    non_ue_failures: NotRequired[list[dict[str, Any]]]


class PduSessionsAnswer(Answered):
    """PDU session establishments."""

    session_count: int
    established_count: int
    rejected_count: int
    reactivation_count: int
    failed_count: int
    sessions: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    incomplete: list[dict[str, Any]]
    warnings: list[str]
    served_by: NotRequired[str]  # set by the tool when the capture's index gave the model
    reason: NotRequired[str]


class StatsAnswer(Answered):
    """Every row of one of Wireshark's statistics (the tool pages them), and what each kind says of them."""

    method: str
    rows: list[dict[str, Any]]
    reason: NotRequired[str]
    total: NotRequired[int]  # rows paged where they are kept (IndexStats): how many there are
    # expert
    items: NotRequired[int]
    by_severity: NotRequired[dict[str, int]]
    by_protocol: NotRequired[dict[str, dict[str, int]]]
    # io
    interval_ms: NotRequired[int]
    frames: NotRequired[int]
    bytes: NotRequired[int]
    # srt (http2: responses_without_request is a count; the paired ones: per message)
    requests: NotRequired[int]
    responses: NotRequired[int]
    responses_without_request: NotRequired[int | dict[str, int]]
    retransmissions: NotRequired[int]
    icmp_errors: NotRequired[int]
    icmp_errors_quoting_no_request: NotRequired[int]
    acks: NotRequired[int]  # sip
    unread_frames: NotRequired[list[int]]  # frames whose messages cannot be told apart


class IndexSummary(TypedDict):
    """What a built index says of the whole capture (index/query.py: summary)."""

    frames: int
    """frames in the capture"""
    first_epoch: str | None
    """the first frame's arrival, Unix seconds as tshark prints it"""
    last_epoch: str | None
    """the last frame's arrival"""
    protocols: list[str]
    """every layer any frame has, in order of first appearance"""


class IndexAnswer(Answered):
    """A capture's persistent index: building (how far) or ready (what it holds)."""

    state: str
    """building, ready or failed"""
    frames_indexed: int
    """frames written so far"""
    index: str | None
    """its directory under the state dir: <sha256>-<decoding>"""
    index_bytes: int | None
    """its size on disk"""
    build_s: float | None
    """how long its build took"""
    schema_version: int
    """the column layout (docs/pcap-index.md)"""
    summary: NotRequired[IndexSummary]
    """frames, first/last arrival (Unix s), protocols in order of appearance"""
    tables_from_sharkd: NotRequired[dict[str, str]]
    """per protocol whose conversations/endpoints the index does not answer: why (sharkd does)"""
    chunked: NotRequired[dict[str, Any]]
    """a capture bigger than index_chunk_mb, read in chunks: how many, their size, its seam frames"""
    error: NotRequired[str]
    """why the build failed"""
    pages_from_frames: NotRequired[int]
    """while building: pages within this many first frames already come from it (pcap_frames_by_filter)"""
    note: NotRequired[str]
    """what to do next"""
