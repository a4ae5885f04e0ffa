"""JSON Schemas of the bpftrace tools' results (their MCP output schemas), kept out of bpftrace.py because they
are long and pure data; they mirror `Execution.page`/`summary` and the tool handlers, and the tests validate
every answer against them.
"""

from __future__ import annotations

from typing import Any

from diagd.actors.bpftrace.execution import Status
from diagd.actors.bpftrace.store import EXECUTION_ID

EXECUTION_ID_ARG = {"type": "string", "pattern": EXECUTION_ID.pattern, "description": "as returned by exec_program"}
_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
_STATE_PROPS: dict[str, Any] = {
    "execution_id": {"type": "string"},
    "status": {"type": "string", "enum": [str(s) for s in Status]},
    "output_format": {"type": "string", "enum": ["text", "json"]},
    "exit_code": _NULLABLE_INT,
    "signal": _NULLABLE_STR,
    "error": _NULLABLE_STR,
    "warnings": {"type": "array", "items": {"type": "string"}},
    "notices": {"type": "array", "items": {"type": "string"}},
    "buffer_full": {"type": "boolean"},
    "lines_dropped": {"type": "integer"},
    "truncated": {"type": "boolean"},
    "lost_events": {"type": "integer"},
    "attached_probes": _NULLABLE_INT,
    "stop_reason": _NULLABLE_STR,
    "stopping": {"type": "boolean"},
    "timeout_s": {"type": "number"},
    "elapsed_s": {"type": "number"},
    "created_at": _NULLABLE_STR,
    "ended_at": _NULLABLE_STR,
    "lines_total": {"type": "integer"},
}
SUMMARY: dict[str, Any] = {
    "type": "object",
    "properties": {**_STATE_PROPS, "program": {"type": "string"}},
    "required": ["execution_id", "status", "lines_total"],
}
RESULT_OUTPUT = {
    "type": "object",
    "properties": {
        **_STATE_PROPS,
        "offset": {"type": "integer"},
        "lines_returned": {"type": "integer"},
        "output": {"type": "array", "items": {"type": ["string", "object"]}},
        "has_more": {"type": "boolean"},
        "next_offset": {"type": "integer"},
        "maps": {"type": ["object", "null"]},
        "line_ts": {"type": ["array", "null"]},
    },
    "required": ["execution_id", "status", "lines_total", "lines_returned", "output", "has_more", "exit_code",
                 "error"],
}
EXEC_OUTPUT = {
    "type": "object",
    "properties": {"execution_id": {"type": "string"}, "status": _STATE_PROPS["status"],
                   "attached_probes": _NULLABLE_INT, "timeout_s": {"type": "number"},
                   "output_format": _STATE_PROPS["output_format"], "pid": _NULLABLE_INT,
                   "lines_total": {"type": "integer"}, "hint": {"type": "string"}},
    "required": ["execution_id", "status"],
}
PROBES_OUTPUT = {
    "type": "object",
    "properties": {
        "probes": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
        "total": {"type": "integer"},
        "offset": {"type": "integer"},
        "returned": {"type": "integer"},
        "has_more": {"type": "boolean"},
        "next_offset": {"type": "integer"},
        "filter": _NULLABLE_STR,
        "tracefs_mounted": {"type": "boolean"},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["probes", "total", "has_more", "tracefs_mounted"],
}
HELPERS_OUTPUT = {
    "type": "object",
    "properties": {
        "bpftrace_version": {"type": "string"},
        "source": {"type": "string"},
        "total": {"type": "integer"},
        "helpers": {"type": "array", "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "kind": {"type": "string"}, "description": {"type": "string"},
                           "signatures": {"type": "array", "items": {"type": "string"}},
                           "flags": {"type": "array", "items": {"type": "string"}}, "type": {"type": "string"}},
            "required": ["name", "kind", "description"]}},
        "not_in_installed_binary": {"type": "array", "items": {"type": "string"}},
        "verified": {"type": "boolean"},
        "warning": {"type": "string"},
    },
    "required": ["bpftrace_version", "helpers", "total", "verified"],
}
EXECUTIONS_OUTPUT = {
    "type": "object",
    "properties": {"executions": {"type": "array", "items": SUMMARY}, "total": {"type": "integer"},
                   "running": {"type": "integer"}, "max_concurrent": {"type": "integer"}},
    "required": ["executions", "total", "running", "max_concurrent"],
}
STOP_OUTPUT = {**SUMMARY, "properties": {**SUMMARY["properties"], "already_finished": {"type": "boolean"}}}
