"""JSON Schemas of the capture tools' arguments (their MCP input schemas), kept out of tools.py because
they are long and pure data; the replies are models (replies.py)."""

from __future__ import annotations

from typing import Any, get_args

from diagd.actors.capture.record import CAPTURE_ID
from diagd.actors.capture.replies import Status

CAPTURE_ID_ARG = {"type": "string", "pattern": CAPTURE_ID.pattern, "description": "as start_capture returned it"}
STATUSES = list(get_args(Status))

START_PROPS: dict[str, Any] = {
    "interfaces": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 64}, "minItems": 1,
                   "maxItems": 8, "description": "interface names ([capture] allowed_interfaces; list_interfaces)"},
    "filter": {"type": "string", "maxLength": 4096, "default": "",
               "description": "capture filter (BPF, pcap-filter(7)): 'sctp or udp port 8805'; checked before start"},
    "snaplen": {"type": "integer", "minimum": 64, "maximum": 262144, "default": 262144,
                "description": "bytes kept per packet"},
    "promiscuous": {"type": "boolean", "default": True, "description": "promiscuous mode"},
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
