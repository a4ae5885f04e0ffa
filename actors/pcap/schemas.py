"""The pcap tools' schemas: shared input fragments and what each tool returns (its outputSchema).

Output schemas name the keys a client can rely on and leave the rest open: nested rows (frames,
UE contexts, sessions) carry what Wireshark's dissectors give, and with `mask_subscriber_ids` an
identity held as a number comes back as a masked string, so those stay untyped.
"""

from __future__ import annotations

from typing import Any

from diagd.actors.tooling import display_filter, object_schema, paging

FRAME_NUMBER = {"type": "integer", "minimum": 1, "maximum": 2**32 - 1}  # frame.number is a uint32 in Wireshark
MAX_TEXT_BYTES = {"type": "integer", "minimum": 1000, "maximum": 2 * 1024 * 1024, "default": 200000,
                  "description": "text budget"}
LAYERS = {"layers": {"type": "array", "items": {"type": "string"}, "default": [], "description": "e.g. ['ngap']"},
          "restrict_layers": {"type": "boolean", "default": True, "description": "text of layers only"}}

# Shared by every pcap tool, so said in a few words: the instructions explain decode_as and profile
# once per session, with examples.
CAPTURE: dict[str, Any] = {
    "pcap_path": {"type": "string", "description": "capture file"},
    # A string or a list of strings (`items` binds arrays only): the same as an anyOf, in fewer bytes.
    "decode_as": {"type": ["string", "array"], "items": {"type": "string"}, "description": "tshark -d rules"},
    "profile": {"type": "string", "description": "pcap profile"},
    "include_command": {"type": "boolean", "default": False, "description": "add tshark command"},
}
FILTER = display_filter()
PAGING = paging(limit=500, maximum=5000)

# -- outputs

STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}
BOOL: dict[str, Any] = {"type": "boolean"}
OBJ: dict[str, Any] = {"type": "object"}
ARRAY: dict[str, Any] = {"type": "array"}
STRINGS: dict[str, Any] = {"type": "array", "items": STR}


def nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


def output(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """An open result object (extra keys allowed)."""
    return object_schema(props, required)


# sha256 is left out (with sha256_pending: true) by a fresh capture's provisional answer.
SOURCE = output({"pcap_path": STR, "sha256": STR, "profile": nullable("string"), "decode_as": STRINGS,
                 "preferences": OBJ, "tshark_version": STR, "display_filter": STR,
                 "equivalent_command": STRINGS, "equivalent_command_line": STR,
                 "decode_as_checked": {"type": "array", "items": OBJ}},
                ("pcap_path", "decode_as", "preferences", "tshark_version"))
# Every answer of a capture's actor: where it came from, and whether it was a cached answer.
ANSWER = {"source": SOURCE, "cached": BOOL}
WARNINGS = {"warnings": STRINGS}

INFO_OUTPUT = output({
    "sha256": STR, "file_size_bytes": INT, "packet_count": INT, "time_start": nullable("string"),
    "time_end": nullable("string"), "duration_s": nullable("number"), "duration_s_text": nullable("string"),
    "file_type": nullable("string"), "file_encapsulation": nullable("string"), "served_by": STR,
    "protocols_ready": BOOL, "has_protocols": {"type": "object", "additionalProperties": BOOL}, "protocols": STRINGS,
    "top_conversations": {"type": "array", "items": OBJ}, "tshark_version": STR, **WARNINGS, **ANSWER,
    # HTTP/1.1 and HTTP/2 by server port: "HTTP/2 on tcp/7777 needs decode-as: applied" (decode_check.py)
    "sbi_ports": {"type": "array", "items": OBJ},
}, ("packet_count", "protocols", "source"))

FRAMES_OUTPUT = output({
    "total": INT, "total_exact": BOOL, "total_at_least": INT, "exact": BOOL, "note": STR,
    "frames": {"type": "array", "items": OBJ}, "has_more": BOOL, "served_by": STR, "hint": STR,
    "limit": INT, "offset": INT, **ANSWER,
}, ("total", "total_exact", "frames", "has_more", "source"))

TIMELINE_OUTPUT = output({
    "total": INT, "total_exact": BOOL, "total_at_least": INT, "served_by": STR,
    "rows": {"type": "array", "items": OBJ}, "has_more": BOOL, "hint": STR,
    "fields_resolved": {"type": "object", "additionalProperties": STR}, "limit": INT, "offset": INT,
    "sort_by": nullable("string"), **WARNINGS, **ANSWER,
}, ("total", "rows", "has_more", "source"))

DETAIL_OUTPUT = output({
    "frames": {"type": "array", "items": output({"frame_number": INT, "protocols": STRINGS, "text": STR,
                                                 "truncated": BOOL, "layers_found": nullable("array")})},
    "truncated": BOOL, "layers_resolved": nullable("object"), **ANSWER,
}, ("frames", "truncated", "source"))

SEARCH_OUTPUT = output({
    "query": STR, "frames_total": INT, "frames_scanned": INT, "offset": INT, "complete": BOOL,
    "stopped_because": nullable("string"), "searched_frames": nullable("array"), "next_offset": nullable("integer"),
    "matches": {"type": "array", "items": output({"frame_number": INT, "match": STR, "line": STR, "snippet": STR})},
    "match_count": INT, "truncated": BOOL, "has_more": BOOL, "frames_without_layers": INT, "note": STR, **ANSWER,
}, ("frames_total", "frames_scanned", "complete", "matches", "source"))

FOLLOW_OUTPUT = output({
    "follow_type": STR, "follow_key": OBJ, "follow_display_filter": STR, "display_filter": STR, "total": INT,
    "total_exact": BOOL, "frames": {"type": "array", "items": OBJ}, "has_more": BOOL, **ANSWER,
}, ("follow_type", "follow_display_filter", "frames", "source"))

PACKET_LIST_OUTPUT = output({
    "output_path": STR, "rows_written": INT, "file_size_bytes": INT, "columns": STRINGS,
    "preview_rows": {"type": "array", "items": OBJ}, **WARNINGS, **ANSWER,
}, ("output_path", "rows_written", "columns", "source"))

EXTRACT_OUTPUT = output({
    "output_path": STR, "packet_count": INT, "file_size_bytes": INT, "display_filter": STR, "source": SOURCE,
}, ("output_path", "packet_count", "file_size_bytes", "display_filter", "source"))

UE_SESSIONS_OUTPUT = output({
    "ue_count": INT, "ues": ARRAY, "failed_ues": ARRAY, "associations": ARRAY, "linked_ue_groups": ARRAY,
    "not_linked": ARRAY,
    "non_ue_failures": ARRAY, "ngap_pdus": INT, "reason": STR, **WARNINGS, **ANSWER,
}, ("ue_count", "ues", "source"))

PDU_SESSIONS_OUTPUT = output({
    "session_count": INT, "established_count": INT, "rejected_count": INT, "sessions": ARRAY, "rejected": ARRAY,
    "incomplete": ARRAY, "reason": STR, **WARNINGS, **ANSWER,
}, ("session_count", "sessions", "source"))

_FIELD = output({"name": STR, "description": STR, "type": STR, "protocol": STR}, ("name",))
LIST_FIELDS_OUTPUT = output({"total": INT, "fields": {"type": "array", "items": _FIELD}, "truncated": BOOL,
                             "tshark_version": STR}, ("total", "fields", "truncated"))
FIELDS_SEARCH_OUTPUT = output({"total": INT, "fields": {"type": "array", "items": _FIELD}, "truncated": BOOL},
                              ("total", "fields", "truncated"))

CONFIG_OUTPUT = output({
    "profiles": OBJ, "packet_list_columns": {"type": "array", "items": OBJ}, "allowed_dirs": STRINGS,
    "output_dir": STR, "max_loaded": INT, "max_memory_mb": INT, "workers_per_capture": INT,
    "idle_timeout_s": nullable("number"), "max_exports": INT,
    "mask_subscriber_ids": BOOL, "call_timeout_s": {"type": "number"},
    "loaded_captures": {"type": "array", "items": OBJ},
}, ("profiles", "allowed_dirs", "output_dir", "loaded_captures"))

# Kept small (every client reads tools/list each turn): the rows' keys are in docs/pcap.md (pcap_stats).
STATS_OUTPUT = output({"rows": ARRAY}, ("rows",))
