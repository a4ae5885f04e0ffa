"""JSON schemas of the crash tools' inputs (descriptions and handlers are in `tools`, replies in `replies`).

Inputs are closed objects (`additionalProperties: false`); `session_id` defaults to the calling
client's last opened session everywhere it appears, and every command-running tool returns a
`CommandResult` (first lines inline, a command_id for the rest).
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
NO_INPUT = _schema({})
SESSION_INPUT = _schema({**SESSION})

OPEN_INPUT = _schema(
    {"vmcore_path": {"type": "string", "description": "the dump"},
     "vmlinux_path": {"type": "string", "description": "the matching vmlinux with DWARF"},
     "crash_args": {"type": "array", "items": {"type": "string"}, "maxItems": 16, "default": [],
                    "description": "e.g. ['--kaslr=auto']"}},
    ("vmcore_path", "vmlinux_path"))
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
SEARCH_INPUT = _schema(
    {"command_id": COMMAND_ID, "query": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "regex"},
     "context_lines": {"type": "integer", "minimum": 0, "maximum": 50, "default": 0, "description": "around a match"},
     "max_matches": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100, "description": "at most"},
     "case_sensitive": {"type": "boolean", "default": False, "description": "match case"}},
    ("command_id", "query"))
RUN_SCRIPT_INPUT = _schema(
    {"name": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+$", "description": "from list_analysis_scripts"},
     **SESSION, "max_lines": MAX_LINES},
    ("name",))

MODULE_DIR_INPUT = _schema({"dir": {"type": "string", "description": "holding the .ko files"}, **SESSION}, ("dir",))
