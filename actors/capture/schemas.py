"""JSON Schemas of the capture tools' arguments and results (their MCP input and output schemas), kept
out of tools.py because they are long and pure data; they mirror `Capture.summary`."""

from __future__ import annotations

from typing import Any

from diagd.actors.capture.record import CAPTURE_ID

CAPTURE_ID_ARG = {"type": "string", "pattern": CAPTURE_ID.pattern, "description": "as start_capture returned it"}
STATUSES = ["starting", "running", "stopped", "failed", "interrupted"]
_STR_OR_NULL = {"type": ["string", "null"]}
_INT_OR_NULL = {"type": ["integer", "null"]}

START_PROPS: dict[str, Any] = {
    "interfaces": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 64}, "minItems": 1,
                   "maxItems": 8, "description": "interface names ([capture] allowed_interfaces; list_interfaces)"},
    "filter": {"type": "string", "maxLength": 4096, "default": "",
               "description": "capture filter (BPF, pcap-filter(7)): 'sctp or udp port 8805'; checked before start"},
    "snaplen": {"type": "integer", "minimum": 64, "maximum": 262144, "default": 262144,
                "description": "bytes kept per packet"},
    "promiscuous": {"type": "boolean", "default": True},
    "ring_files": {"type": "integer", "minimum": 2, "maximum": 1000,
                   "description": "ring buffer: keep this many files (needs file_size_kb or file_duration_s)"},
    "file_size_kb": {"type": "integer", "minimum": 1, "maximum": 2_000_000_000,
                     "description": "switch to the next file at this size (kB)"},
    "file_duration_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400,
                        "description": "switch to the next file after this many seconds"},
    "duration_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 604800,
                   "description": "stop after this many seconds (default and cap: [capture] max_duration_s)"},
    "packets": {"type": "integer", "minimum": 1, "description": "stop after this many packets"},
    "bytes": {"type": "integer", "minimum": 1, "description": "stop once the files hold this many bytes"},
}

SUMMARY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "capture_id": {"type": "string"}, "status": {"type": "string", "enum": STATUSES},
        "running": {"type": "boolean"}, "stop_reason": _STR_OR_NULL, "stopped_by": _STR_OR_NULL,
        "error": _STR_OR_NULL, "owner": {"type": "string"}, "owner_connected": {"type": ["boolean", "null"]},
        "interfaces": {"type": "array", "items": {"type": "string"}}, "filter": {"type": "string"},
        "snaplen": {"type": "integer"}, "ring": {"type": "object"}, "stop_on": {"type": "object"},
        "packets": {"type": "integer"}, "bytes_written": {"type": "integer"}, "bytes_on_disk": {"type": "integer"},
        "drops": {"type": "object", "properties": {
            "kernel": _INT_OR_NULL, "interface": _INT_OR_NULL, "by_interface": {"type": ["object", "null"]},
            "interface_statistics": {"type": ["object", "null"]}}},
        "files": {"type": "array", "items": {"type": "string"}}, "current_file": _STR_OR_NULL,
        "files_written": {"type": "integer"}, "evicted": {"type": "boolean"}, "dir": {"type": "string"},
        "created_at": _STR_OR_NULL, "started_at": _STR_OR_NULL, "ended_at": _STR_OR_NULL,
        "elapsed_s": {"type": "number"}, "pid": _INT_OR_NULL,
    },
    "required": ["capture_id", "status", "running", "packets", "files", "drops"],
}
STATUS_OUTPUT: dict[str, Any] = {**SUMMARY, "properties": {**SUMMARY["properties"], "hint": {"type": "string"},
                                                           "already_stopped": {"type": "boolean"},
                                                           "took_over_from": _STR_OR_NULL}}
CAPTURES_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {"captures": {"type": "array", "items": SUMMARY}, "total": {"type": "integer"},
                   "running": {"type": "integer"}, "bytes_on_disk": {"type": "integer"},
                   "max_bytes": {"type": "integer"}, "max_concurrent": {"type": "integer"}},
    "required": ["captures", "total", "running"],
}
INTERFACE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "description": {"type": "string"}, "type": {"type": "string"},
        "addresses": {"type": "array", "items": {"type": "string"}}, "loopback": {"type": "boolean"},
        "up": {"type": ["boolean", "null"]}, "running": {"type": ["boolean", "null"]}, "operstate": _STR_OR_NULL,
        "allowed": {"type": "boolean"}, "monitor_mode": {"type": "boolean"},
        "link_types": {"type": "array", "items": {"type": "object"}}, "link_types_error": {"type": "string"},
    },
    "required": ["name", "allowed", "up"],
}
INTERFACES_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {"interfaces": {"type": "array", "items": INTERFACE}, "count": {"type": "integer"},
                   "capture_enabled": {"type": "boolean"},
                   "allowed_interfaces": {"type": "array", "items": {"type": "string"}}},
    "required": ["interfaces", "count", "capture_enabled"],
}
