"""The pcap tools' replies as models: what each tool returns (its outputSchema is generated from them).

The models name the keys a client can rely on and leave the rest open: nested rows (frames, UE
contexts, sessions, statistics) carry what Wireshark's dissectors give, and with
`mask_subscriber_ids` an identity held as a number comes back as a masked string, so those stay
`dict[str, Any]`. The schemas come from actors/replies.py.
"""

from __future__ import annotations

from typing import Any, NotRequired

from typing_extensions import TypedDict

from diagd.actors.pcap.answer_types import DetailFrame, IndexAnswer, SearchMatch


class Source(TypedDict):
    """Where an answer came from: the capture, how it was decoded, and the tshark command that prints it."""

    pcap_path: str
    """the capture file"""
    sha256: NotRequired[str]
    """the capture's content hash (left out of a fresh capture's provisional answer)"""
    sha256_pending: NotRequired[bool]
    """a provisional answer did not wait for the hash"""
    profile: str | None
    """the pcap profile used"""
    decode_as: list[str]
    """the tshark -d rules applied"""
    preferences: dict[str, Any]
    """the Wireshark preferences set"""
    tshark_version: str
    """the Wireshark version that decoded it"""
    display_filter: NotRequired[str]
    """the display filter applied"""
    equivalent_command: NotRequired[list[str]]
    """include_command: the tshark argv that prints the same"""
    equivalent_command_line: NotRequired[str]
    """include_command: the same, as a shell line"""
    decode_as_checked: NotRequired[list[dict[str, Any]]]
    """port rules checked against what each conversation carries"""
    live: NotRequired[dict[str, Any]]
    """a capture:<id> reference: up to which frame and time the answer covers, and whether it still grows"""


class Answer(TypedDict):
    """What every answer about a capture carries."""

    source: Source
    """where it came from"""
    cached: NotRequired[bool]
    """an answer kept from an earlier identical call"""


class IndexReply(Answer, IndexAnswer):
    """A capture's persistent index (Parquet, read with DuckDB): the actor's answer and its source."""


class InfoReply(Answer):
    """A capture's facts."""

    sha256: NotRequired[str]
    """the capture's content hash (a fresh big file: still being hashed)"""
    packet_count: int
    """frames, as capinfos counts them"""
    protocols: list[str]
    """the protocols found"""
    file_size_bytes: NotRequired[int]
    """the file's size"""
    time_start: NotRequired[str | None]
    """the first frame's time, UTC (the capture's precision)"""
    time_end: NotRequired[str | None]
    """the last frame's time"""
    duration_s: NotRequired[float | None]
    """time_end - time_start"""
    duration_s_text: NotRequired[str | None]
    """the same, as capinfos prints it"""
    file_type: NotRequired[str | None]
    """pcap, pcapng, ..."""
    file_encapsulation: NotRequired[str | None]
    """the link type"""
    served_by: NotRequired[str]
    """sharkd, tshark or capinfos (which answered)"""
    protocols_ready: NotRequired[bool]
    """false: the protocols are still being read (call again)"""
    has_protocols: NotRequired[dict[str, bool]]
    """protocol -> found (the ones the tools know)"""
    top_conversations: NotRequired[list[dict[str, Any]]]
    """the largest IP conversations"""
    tshark_version: NotRequired[str]
    """the Wireshark version"""
    warnings: NotRequired[list[str]]
    """what is odd about the file or its decoding"""
    sbi_ports: NotRequired[list[dict[str, Any]]]
    """HTTP/1.1 and HTTP/2 by server port, and the decode-as each needs"""


class FramesReply(Answer):
    """A page of packet-list rows."""

    total: int
    """frames matching (at least, when total_exact is false)"""
    total_exact: bool
    """total is the exact count"""
    frames: list[dict[str, Any]]
    """packet-list rows (number, time, source, destination, protocol, length, info, ...)"""
    has_more: bool
    """rows past this page"""
    total_at_least: NotRequired[int]
    """a lower bound while the capture is still loading"""
    exact: NotRequired[bool]
    """false: rows of a single pass while the capture loads (their provisional columns may change)"""
    note: NotRequired[str]
    """how the total was counted"""
    served_by: NotRequired[str]
    """sharkd or tshark"""
    hint: NotRequired[str]
    """why nothing matched, and what would"""
    limit: NotRequired[int]
    """the page size"""
    offset: NotRequired[int]
    """the rows skipped"""


class TimelineReply(Answer):
    """Field values per matching frame."""

    total: int
    """frames matching"""
    rows: list[dict[str, Any]]
    """field -> value (an array for a repeated field), per frame"""
    has_more: bool
    """rows past this page"""
    total_exact: NotRequired[bool]
    """total is the exact count (false: a fresh capture's first page)"""
    total_at_least: NotRequired[int]
    """a lower bound while the capture is still loading"""
    served_by: NotRequired[str]
    """sharkd or tshark (a single pass while sharkd loads)"""
    hint: NotRequired[str]
    """why nothing matched, and what would"""
    note: NotRequired[str]
    """why rows list `provisional` fields (a chunked index's seam frames)"""
    fields_resolved: NotRequired[dict[str, str]]
    """each asked name -> the field used"""
    limit: NotRequired[int]
    """the page size"""
    offset: NotRequired[int]
    """the rows skipped"""
    sort_by: NotRequired[str | None]
    """the field the rows are sorted by"""
    warnings: NotRequired[list[str]]
    """fields renamed or deprecated"""


class DetailReply(Answer):
    frames: list[DetailFrame]
    """the frames asked for"""
    truncated: bool
    """some text was cut at max_bytes"""
    layers_resolved: NotRequired[dict[str, Any] | None]
    """each asked layer -> the protocol used"""


class SearchReply(Answer):
    """Where a text occurs in the decoded frames."""

    frames_total: int
    """frames matching the display filter"""
    frames_scanned: int
    """frames searched by this call"""
    complete: bool
    """every frame was searched (false: go on from next_offset)"""
    matches: list[SearchMatch]
    """up to max_matches"""
    query: NotRequired[str]
    """the text or regex"""
    offset: NotRequired[int]
    """frames skipped"""
    stopped_because: NotRequired[str | None]
    """why the search stopped before the end"""
    searched_frames: NotRequired[list[int] | None]
    """the first and last frames searched"""
    next_offset: NotRequired[int | None]
    """offset to go on from"""
    match_count: NotRequired[int]
    """matches found"""
    truncated: NotRequired[bool]
    """more matches than returned"""
    has_more: NotRequired[bool]
    """frames past those searched"""
    frames_without_layers: NotRequired[int]
    """frames that have none of the asked layers"""
    frames_ruled_out: NotRequired[int]
    """frames a single pass showed cannot hold the literal (not read from sharkd)"""
    total_exact: NotRequired[bool]
    """frames_total is exact"""
    total_at_least: NotRequired[int]
    """a lower bound (loading, or a filter not counted yet)"""
    exact: NotRequired[bool]
    """false: a single pass's text"""
    served_by: NotRequired[str]
    """what read the frames and their text"""
    note: NotRequired[str]
    """how the search went"""


class FollowReply(Answer):
    """A frame's stream, session, call or GTPv2-C tunnel, and its frames."""

    follow_type: str
    """the key followed: http2.streamid, diameter.Session-Id, sip.Call-ID, gtpv2.teid, gtpv2.seq, tcp.stream or
    udp.stream"""
    follow_display_filter: str
    """the filter that selects it"""
    frames: list[dict[str, Any]]
    """its frames (packet-list rows)"""
    follow_key: NotRequired[dict[str, Any]]
    """what identifies it (stream id, session id, call id, the tunnel's address and TEID ends, sequence number)"""
    followed: NotRequired[str]
    """what was followed, by what key, in words"""
    transaction: NotRequired[dict[str, Any]]
    """GTPv2-C: the frame's request/response exchange (sequence number, frames)"""
    text: NotRequired[dict[str, Any]]
    """text > 0: the TCP/UDP stream's payload as tshark -z follow,tcp|udp,ascii prints it, per chunk, and
    where it was cut"""
    hint: NotRequired[str]
    """followed as TCP although the frame carries no protocol above it: where HTTP/2 may need a decode-as"""
    display_filter: NotRequired[str]
    """the filter applied (with the caller's)"""
    total: NotRequired[int]
    """its frames"""
    total_exact: NotRequired[bool]
    """total is exact"""
    has_more: NotRequired[bool]
    """frames past this page"""


class PacketListReply(Answer):
    """The packet-list TSV written."""

    output_path: str
    """the file written"""
    rows_written: int
    """rows in it"""
    columns: list[str]
    """its columns"""
    file_size_bytes: NotRequired[int]
    """its size"""
    preview_rows: NotRequired[list[dict[str, Any]]]
    """its first rows"""
    warnings: NotRequired[list[str]]
    """fields renamed or deprecated"""


class ExtractReply(Answer):
    """The subcapture written."""

    output_path: str
    """the pcapng written"""
    packet_count: int
    """frames in it"""
    file_size_bytes: int
    """its size"""
    display_filter: str
    """the filter that chose them"""


class UeSessionsReply(Answer):
    """NGAP UE contexts (or procedures) and associations."""

    ue_count: int
    """UE contexts"""
    ues: list[Any]
    """per UE context: ids, gNB, identities, procedures, NAS messages, failures"""
    failed_ues: NotRequired[list[Any]]
    """UE contexts with a failure"""
    associations: NotRequired[list[Any]]
    """NG (SCTP) associations"""
    linked_ue_groups: NotRequired[list[Any]]
    """UE contexts that are one UE (same identity)"""
    not_linked: NotRequired[list[Any]]
    """UE contexts no identity links"""
    non_ue_failures: NotRequired[list[Any]]
    """failures of no UE context (setup, reset, ...)"""
    ngap_pdus: NotRequired[int]
    """NGAP PDUs read"""
    offset: NotRequired[int]
    """ues and the lists of some of them: from this one"""
    has_more: NotRequired[bool]
    """any of them: more after this page"""
    totals: NotRequired[dict[str, int]]
    """how many each paged list holds"""
    served_by: NotRequired[str]
    """the capture's index (the SCTP frames cut from it, read once) or, without it, the loaded capture"""
    reason: NotRequired[str]
    """why there is nothing"""
    warnings: NotRequired[list[str]]
    """what could not be read"""


class PduSessionsReply(Answer):
    """PDU session establishments."""

    session_count: int
    """PDU sessions"""
    sessions: list[Any]
    """per session: NAS and N2 messages, N3 address/TEID, QFIs, S-NSSAI, DNN, UE IP, causes"""
    established_count: NotRequired[int]
    """sessions established"""
    rejected_count: NotRequired[int]
    """sessions rejected"""
    rejected: NotRequired[list[Any]]
    """the rejected ones"""
    incomplete: NotRequired[list[Any]]
    """the ones with no answer in the capture"""
    offset: NotRequired[int]
    """sessions, rejected, incomplete: from this one"""
    has_more: NotRequired[bool]
    """any of them: more after this page"""
    totals: NotRequired[dict[str, int]]
    """how many each paged list holds"""
    served_by: NotRequired[str]
    """the capture's index (the SCTP frames cut from it, read once) or, without it, the loaded capture"""
    reason: NotRequired[str]
    """why there is nothing"""
    warnings: NotRequired[list[str]]
    """what could not be read"""


class StatsReply(Answer):
    """A page of a tshark -z statistic's rows (their keys per kind: docs/pcap.md)."""

    kind: str
    """the statistic"""
    protocol: str | None
    """srt/conversations/endpoints: of this protocol"""
    total: int
    """rows"""
    rows: list[Any]
    """this page's rows"""
    offset: int
    """rows skipped"""
    limit: int
    """the page size"""
    has_more: bool
    """rows past this page"""
    reason: NotRequired[str]
    """why the page is empty"""
    method: NotRequired[str]
    """how the rows were computed"""
    requests: NotRequired[int]
    """srt: requests (retransmissions not counted)"""
    responses: NotRequired[int]
    """srt: responses"""
    responses_without_request: NotRequired[Any]
    """srt: responses no request in view answers (per message; http2: a count)"""
    retransmissions: NotRequired[int]
    """srt: requests sent again"""
    icmp_errors: NotRequired[int]
    """srt: ICMP errors quoting a message"""


class FieldInfo(TypedDict):
    name: str
    """the field's name"""
    description: str
    """what it holds"""
    type: str
    """its Wireshark type"""
    protocol: NotRequired[str]
    """its protocol"""


class FieldsSearchReply(TypedDict):
    total: int
    """fields matching"""
    fields: list[FieldInfo]
    """up to limit"""
    truncated: bool
    """more fields match than returned"""


class ListFieldsReply(FieldsSearchReply):
    tshark_version: str
    """the Wireshark version whose fields these are"""


class ConfigReply(TypedDict):
    """The pcap back end's settings in force, and the loaded captures."""

    profiles: dict[str, Any]
    """[pcap.profiles]: name -> decode-as rules and preferences"""
    packet_list_columns: list[dict[str, Any]]
    """the packet list's default columns"""
    allowed_dirs: list[str]
    """directories captures may be read from"""
    output_dir: str
    """where exports are written"""
    max_loaded: int
    """captures kept loaded at once"""
    max_memory_mb: int
    """the loaded captures' memory cap"""
    workers_per_capture: int
    """sharkd workers per capture"""
    idle_timeout_s: float | None
    """a capture unused this long is unloaded (null: never)"""
    max_exports: int
    """exports kept in output_dir"""
    mask_subscriber_ids: bool
    """subscriber identities are masked"""
    call_timeout_s: float
    """the daemon's call timeout"""
    loaded_captures: list[dict[str, Any]]
    """each loaded capture's actor statistics"""


class SequenceReply(Answer):
    """A Mermaid sequence diagram of the frames selected."""

    diagram: str
    """the Mermaid sequenceDiagram"""
    frames_matched: NotRequired[int]
    """frames selected"""
    offset: NotRequired[int]
    """frames of the selection skipped"""
    left_out: NotRequired[int]
    """frames not drawn (max_arrows, offset)"""
    next_offset: NotRequired[int | None]
    """offset that draws the next frames (null: the end)"""
    selection: NotRequired[dict[str, Any]]
    """what was selected"""
    display_filter: NotRequired[str]
    """the filter that selected the frames"""
    participants: NotRequired[list[dict[str, Any]]]
    """the lifelines: id, name, address, port, role"""
    messages: NotRequired[list[dict[str, Any]]]
    """the arrows in order: frame, time, from and to (participant ids), label, failed (to MCP Apps clients only:
    the ladder view's data, docs/views.md)"""
    failures: NotRequired[list[dict[str, Any]]]
    """the frames drawn as -x: their cause, and the verdicts they decided with the rule of each"""
    n4_sbi: NotRequired[list[dict[str, Any]]]
    """a PDU session's PFCP and SBI messages (drawn with their responses)"""
    warnings: NotRequired[list[str]]
    """what was cut or not drawn"""
    reason: NotRequired[str]
    """why nothing was drawn"""
