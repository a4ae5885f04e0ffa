"""JSON schemas of the crash tools' inputs and outputs (descriptions and handlers are in `tools`).

Inputs are closed objects (`additionalProperties: false`); `session_id` defaults to the calling
client's last opened session everywhere it appears, and every command-running tool returns
`COMMAND_RESULT` (first lines inline, a command_id for the rest).
"""

from __future__ import annotations

from typing import Any

from diagd.actors.crash.store import MAX_PAGE_LINES
from diagd.actors.tooling import paging


def _schema(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:  # an empty list says nothing: left out of every tools/list
        schema["required"] = list(required)
    return schema


SESSION = {"session_id": {"type": "string", "description": "default: your last opened"}}
MAX_LINES = {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LINES, "description": "lines inline"}
COMMAND_ID = {"type": "string", "description": "from a command's result"}
COMMAND_RESULT = {
    "type": "object",
    "properties": {"session_id": {"type": "string"}, "command_id": {"type": "string"}, "output": {"type": "string"},
                   "total_lines": {"type": "integer"}, "lines_returned": {"type": "integer"},
                   "cached": {"type": "boolean"},
                   "truncated": {"type": "boolean", "description": "more lines than shown here: page them"},
                   "output_truncated": {"type": "boolean",
                                        "description": "the stored output itself was cut at [crash] max_output_bytes"},
                   "truncated_reason": {"type": "string"},
                   "session_restarted": {"type": "object", "description": "crash had died and was started again "
                                         "for this call: why, and what state was lost"},
                   "session_reopened": {"type": "object", "description": "the session was reopened after a daemon "
                                        "restart (told once per client): state set before (set, drgn variables) "
                                        "is gone"}},
    "required": ["session_id", "command_id", "output", "total_lines", "cached"],
}
NO_INPUT = _schema({})
SESSION_INPUT = _schema({**SESSION})

OPEN_INPUT = _schema(
    {"vmcore_path": {"type": "string", "description": "the dump"},
     "vmlinux_path": {"type": "string", "description": "the matching vmlinux with DWARF"},
     "crash_args": {"type": "array", "items": {"type": "string"}, "maxItems": 16, "default": [],
                    "description": "e.g. ['--kaslr=auto']"}},
    ("vmcore_path", "vmlinux_path"))
OPEN_OUTPUT = {"type": "object", "properties": {"session_id": {"type": "string"}, "workdir": {"type": "string"},
                                                "is_new": {"type": "boolean"}, "summary": {"type": "object"},
                                                "joined": {"type": "boolean"},
                                                "requested": {"type": "object", "description": "the paths this "
                                                              "call named, when it joined a session opened "
                                                              "under others"}},
               "required": ["session_id", "workdir", "is_new", "summary"]}

RUN_CRASH_INPUT = _schema(
    {"command": {"type": "string", "minLength": 1, "maxLength": 4000,
                 "description": "as typed at crash> (no pipes or !shell); 'drgn:<python>' runs drgn"}, **SESSION,
     "force_execute": {"type": "boolean", "default": False, "description": "run it again, not the cached"},
     "max_lines": MAX_LINES},
    ("command",))
RUN_DRGN_INPUT = _schema(
    {"code": {"type": "string", "minLength": 1, "maxLength": 200000, "description": "Python"}, **SESSION,
     "max_lines": MAX_LINES},
    ("code",))

GET_OUTPUT_INPUT = _schema(
    {"command_id": COMMAND_ID, **paging(limit=100, maximum=MAX_PAGE_LINES)},
    ("command_id",))
GET_OUTPUT_OUTPUT = {"type": "object", "properties": {"command_id": {"type": "string"}, "output": {"type": "string"},
                                                      "total_lines": {"type": "integer"},
                                                      "has_more": {"type": "boolean"}},
                     "required": ["command_id", "output", "total_lines", "has_more"]}

SEARCH_INPUT = _schema(
    {"command_id": COMMAND_ID, "query": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "regex"},
     "context_lines": {"type": "integer", "minimum": 0, "maximum": 50, "default": 0, "description": "around a match"},
     "max_matches": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100, "description": "at most"},
     "case_sensitive": {"type": "boolean", "default": False, "description": "match case"}},
    ("command_id", "query"))
SEARCH_OUTPUT = {"type": "object", "properties": {"match_count": {"type": "integer"}, "matches": {"type": "array"}},
                 "required": ["match_count", "matches"]}

RUN_SCRIPT_INPUT = _schema(
    {"name": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+$", "description": "from list_analysis_scripts"},
     **SESSION, "max_lines": MAX_LINES},
    ("name",))

CLOSE_OUTPUT = {"type": "object", "properties": {"session_id": {"type": "string"}, "closed": {"type": "boolean"},
                                                 "state": {"type": "string"}, "refcount": {"type": "integer"},
                                                 "workdir": {"type": "string"},
                                                 "held_by": {"type": "array", "items": {"type": "string"}},
                                                 "stopped": {"type": "object", "description": "how each child "
                                                             "process ended (quit, sigterm, sigkill)"},
                                                 "note": {"type": "string"}},
                "required": ["session_id", "closed", "state", "refcount", "workdir"]}
LIST_OUTPUT = {"type": "object", "properties": {"sessions": {"type": "array", "items": {"type": "object"}},
                                                "default_for_this_client": {"type": ["string", "null"]}},
               "required": ["sessions"]}
TRIAGE_OUTPUT = {"type": "object",
                 "properties": {"session_id": {"type": "string"}, "system": {"type": "object"},
                                "panic": {"type": ["string", "null"]}, "panic_task": {"type": ["object", "null"]},
                                "backtrace": {"type": "object"}, "log_tail": {"type": "object"},
                                "memory": {"type": "object"}, "tasks": {"type": "object"},
                                "limits": {"type": "array"}, "next_steps": {"type": "array"}},
                 "required": ["session_id", "system", "backtrace", "log_tail", "memory", "tasks"]}
SCRIPTS_OUTPUT = {"type": "object", "properties": {"scripts": {"type": "array", "items": {"type": "object"}},
                                                   "dirs": {"type": "array", "items": {"type": "string"}}},
                  "required": ["scripts", "dirs"]}

MODULE_DIR_INPUT = _schema({"dir": {"type": "string", "description": "holding the .ko files"}, **SESSION}, ("dir",))
MODULE_DIR_OUTPUT = {"type": "object", "properties": {"session_id": {"type": "string"}, "dir": {"type": "string"},
                                                      "modules": {"type": "array"}, "drgn": {"type": "object"},
                                                      "files": {"type": "array"}, "left_out": {"type": "array"}},
                     "required": ["session_id", "dir", "modules", "drgn"]}
