"""The serial tools' descriptions, input and output schemas (pure data), by tool name: `TOOLS[name]`
is what tools.py passes to `ToolSet.tool`."""

from __future__ import annotations

from typing import Any

from diagd.actors.serial.codec import ESCAPES_HELP
from diagd.actors.serial.settings import LINE_ENDINGS, PortState
from diagd.actors.tooling import paging

_PORT = {"type": "string", "minLength": 1, "description": "/dev/ttyUSB0 or ttyUSB0"}
_AS_HEX = {"type": "boolean", "default": False, "description": "data as hex even if text"}
_NULLABLE_STR = {"type": ["string", "null"]}
_STATES = [str(s) for s in PortState]
_PORT_STATUS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "port": {"type": "string"}, "device": _NULLABLE_STR, "state": {"enum": _STATES}, "owner": _NULLABLE_STR,
        "you_own": {"type": "boolean"}, "settings": {"type": "object"}, "bytes_in": {"type": "integer"},
        "bytes_out": {"type": "integer"}, "pending_urc_count": {"type": "integer"},
        "urc_dropped": {"type": "integer"}, "log_file": _NULLABLE_STR, "holders": {"type": "array"},
    },
    "required": ["port", "state"],
}
_PACKET = {
    "type": "object",
    "properties": {"ts": {"type": "number"}, "data": {"type": "string"}, "format": {"enum": ["text", "hex"]},
                   "bytes": {"type": "integer"}, "split": {"type": "boolean"}},
    "required": ["ts", "data", "format", "bytes"],
}


def _tool(description: str, properties: dict[str, Any], output: dict[str, Any], *, required: tuple[str, ...] = (),
          title: str, read_only: bool = True, idempotent: bool = True, destructive: bool = False,
          timeout_s: float | None = None) -> dict[str, Any]:
    """The keyword arguments of `ToolSet.tool` for one tool (tools.py declares it with them)."""
    return {"description": description, "props": properties, "required": required, "output": output,
            "title": title, "read_only": read_only, "idempotent": idempotent, "destructive": destructive,
            "timeout_s": timeout_s}


TOOLS: dict[str, dict[str, Any]] = {
    "list_ports": _tool(
        "Every serial port (description, hardware id), whether allowed, its state, and ports added/removed "
        "since your last call.",
        {},
        {"type": "object", "properties": {
            "ports": {"type": "array", "items": {"type": "object", "properties": {
                "port": {"type": "string"}, "description": {"type": "string"}, "hwid": {"type": "string"},
                "label": {"type": "string"}, "allowed": {"type": "boolean"}, "state": {"enum": _STATES}},
                "required": ["port", "description", "hwid", "label", "allowed", "state"]}},
            "count": {"type": "integer"}, "added": {"type": "array", "items": {"type": "string"}},
            "removed": {"type": "array", "items": {"type": "string"}}, "first_call": {"type": "boolean"}},
         "required": ["ports", "count", "added", "removed", "first_call"]},
        title="List serial ports"),
    "configure_connection": _tool(
        "Open a port and keep it open (output between calls goes to the URC buffer); again on an open port: "
        "new settings.",
        {"port": _PORT,
         "action": {"enum": ["open", "close"], "default": "open", "description": "close releases it"},
         "baudrate": {"type": "integer", "minimum": 50, "maximum": 16000000, "description": "bit/s"},
         "bytesize": {"type": "integer", "enum": [5, 6, 7, 8], "description": "data bits"},
         "parity": {"enum": ["N", "E", "O", "M", "S"], "description": "none/even/odd/mark/space"},
         "stopbits": {"type": "number", "enum": [1, 1.5, 2], "description": "stop bits"},
         "rtscts": {"type": "boolean", "description": "RTS/CTS flow control"},
         "xonxoff": {"type": "boolean", "description": "XON/XOFF flow control"},
         "dsrdtr": {"type": "boolean", "description": "DSR/DTR flow control"},
         "idle_ms": {"type": "integer", "minimum": 1, "maximum": 10000,
                     "description": "an idle gap this long ends a packet"},
         "line_ending": {"enum": list(LINE_ENDINGS), "description": "send_data's default (else [serial]'s, cr)"},
         "dtr": {"type": "boolean", "description": "false at open: no reset pulse"},
         "rts": {"type": "boolean", "description": "RTS level"},
         "force": {"type": "boolean", "default": False, "description": "take it from another client"}},
        {"type": "object", "properties": {
            **_PORT_STATUS["properties"], "success": {"type": "boolean"}, "action": {"enum": ["open", "close"]},
            "outcome": {"enum": ["opened", "reconfigured", "reopened", "closed"]},
            "took_over_from": _NULLABLE_STR, "discarded_urc_packets": {"type": "integer"}},
         "required": ["success", "action", "outcome", "port", "state"]},
        required=("port",), title="Open, reconfigure or close a serial port", read_only=False, idempotent=False,
        timeout_s=60),
    "connection_status": _tool(
        "State, owner, settings and counters of one port (or of every open one); for a port diagd has not "
        "opened, the processes holding it.",
        {"port": _PORT},
        {"type": "object", "properties": {"ports": {"type": "array", "items": _PORT_STATUS}}, "required": ["ports"]},
        title="Serial connection status"),
    "send_data": _tool(
        "Write payload, then collect the reply (data: text, or hex if not clean text). Later output goes to "
        "the URC buffer. success means written and waited, not a good reply.",
        {"port": _PORT,
         "payload": {"type": "string",
                     "description": f"utf8 text (escapes: {ESCAPES_HELP}) or hex ('0A 0D'); empty: just listen"},
         "encoding": {"enum": ["utf8", "hex"], "default": "utf8", "description": "of payload"},
         "wait_policy": {"enum": ["keyword", "timeout", "none"],
                         "description": "read until stop_pattern (none came: success=false, timed_out) or "
                                        "timeout_ms, or return; default: keyword with stop_pattern, else timeout"},
         "stop_pattern": {"type": ["string", "array"], "items": {"type": "string", "minLength": 1},
                          "minLength": 1, "minItems": 1, "maxItems": 8,
                          "description": "e.g. ['OK\\r\\n','ERROR\\r\\n'] (the first to complete ends the wait)"},
         "stop_pattern_encoding": {"enum": ["utf8", "hex"],
                                   "description": "default: encoding"},
         "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 300000, "default": 1000,
                        "description": "wait at most"},
         "line_ending": {"enum": list(LINE_ENDINGS), "description": "default: the port's"},
         "escapes": {"type": "boolean", "default": True, "description": "false: backslashes are sent as they are"},
         "as_hex": _AS_HEX},
        {"type": "object", "properties": {
            "success": {"type": "boolean"}, "port": {"type": "string"}, "wait_policy": {"type": "string"},
            "data": {"type": "string"}, "format": {"enum": ["text", "hex"]}, "is_hex": {"type": "boolean"},
            "bytes_sent": {"type": "integer"}, "bytes_received": {"type": "integer"},
            "found_keyword": {"type": "boolean"}, "stop_pattern_matched": _NULLABLE_STR,
            "timed_out": {"type": "boolean"}, "truncated": {"type": "boolean"},
            "pending_urc_count": {"type": "integer"}, "urc_dropped": {"type": "integer"},
            "elapsed_ms": {"type": "number"}, "log_offset": {"type": ["integer", "null"]}, "note": {"type": "string"},
            "reason": {"type": "string", "description": "why success is false"}},
         "required": ["success", "port", "data", "format", "is_hex", "bytes_sent", "bytes_received", "found_keyword",
                      "timed_out", "truncated", "pending_urc_count", "elapsed_ms"]},
        required=("port", "payload"), title="Send data to a serial port", read_only=False, idempotent=False,
        timeout_s=330),
    "read_urc": _tool(
        "Output that arrived while no send_data waited (URCs, logs), as timestamped packets, oldest first.",
        {"port": _PORT,
         "max_packets": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50, "description": "at most"},
         "peek": {"type": "boolean", "default": False, "description": "leave them buffered"}, "as_hex": _AS_HEX},
        {"type": "object", "properties": {
            "port": {"type": "string"}, "state": {"enum": _STATES}, "packets": {"type": "array", "items": _PACKET},
            "returned": {"type": "integer"},
            "pending_urc_count": {"type": "integer",
                                  "description": "packets in the buffer after this call (a peek leaves them there)"},
            "has_more": {"type": "boolean", "description": "packets past those returned are waiting"},
            "dropped": {"type": "integer"}, "dropped_total": {"type": "integer"}},
         "required": ["port", "state", "packets", "returned", "pending_urc_count", "has_more", "dropped"]},
        required=("port",), title="Read unsolicited serial output", read_only=False, idempotent=False),
    "set_signals": _tool(
        "Set DTR/RTS and/or send a break, e.g. to reset a board.",
        {"port": _PORT, "dtr": {"type": "boolean", "description": "DTR level"},
         "rts": {"type": "boolean", "description": "RTS level"},
         "break_ms": {"type": "integer", "minimum": 1, "maximum": 10000, "description": "break this long"}},
        {"type": "object", "properties": {
            "success": {"type": "boolean"}, "port": {"type": "string"}, "dtr": {"type": ["boolean", "null"]},
            "rts": {"type": ["boolean", "null"]}, "break_ms": {"type": ["integer", "null"]},
            "modem_lines": {"type": ["object", "null"]}},
         "required": ["success", "port"]},
        required=("port",), title="Set serial control lines", read_only=False, idempotent=False),
    "get_log": _tool(
        "Page the raw Tx/Rx log of the port's current or last session (every byte, timestamped); follow "
        "next_offset.",
        {"port": _PORT, **paging(limit=100, maximum=1000), "as_hex": _AS_HEX},
        {"type": "object", "properties": {
            "port": {"type": "string"}, "log_file": {"type": "string"}, "live": {"type": "boolean"},
            "offset": {"type": "integer"}, "returned": {"type": "integer"}, "total_records": {"type": "integer"},
            "next_offset": {"type": ["integer", "null"]}, "records": {"type": "array", "items": {
                "type": "object", "properties": {"i": {"type": "integer"}, "dir": {"enum": ["tx", "rx", "event"]}},
                "required": ["i", "dir"]}}},
         "required": ["port", "log_file", "offset", "returned", "total_records", "next_offset", "records"]},
        required=("port",), title="Read the raw serial log"),
    "export_serial_pcapng": _tool(
        "A session's raw log as pcapng for the pcap tools (a packet per Tx/Rx chunk; frame.p2p_dir 0=Tx, 1=Rx), "
        "written to diagd's exports dir; the answer's pcapng_path names it.",
        {"port": _PORT, "session": {"type": "string", "description": "log name; default: the current or last"},
         "name": {"type": "string",
                  "description": "file stem [A-Za-z0-9._-], no extension (.pcapng is added)"}},
        {"type": "object", "properties": {"pcapng_path": {"type": "string"}, "packets": {"type": "integer"}},
         "required": ["pcapng_path", "packets"]},
        required=("port",), title="Serial session to pcapng", read_only=False, idempotent=False,
        timeout_s=600),
}
