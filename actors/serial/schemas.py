"""The serial tools' descriptions, input and output schemas (pure data), by tool name: `TOOLS[name]`
is what tools.py passes to `ToolSet.tool`."""

from __future__ import annotations

from typing import Any

from diagd.actors.serial.codec import ESCAPES_HELP
from diagd.actors.serial.settings import LINE_ENDINGS, PortState

_PORT = {"type": "string", "minLength": 1,
         "description": "Device path, e.g. /dev/ttyUSB0 or a /dev/serial/by-id link (a bare name means /dev/<name>)."}
_AS_HEX = {"type": "boolean", "default": False,
           "description": "Always return data as hex, even when it would decode as text."}
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
        "Every serial port with its description and hardware id (e.g. '/dev/ttyUSB0 - CP2102'), whether "
        "[serial] allowed_ports permits it, its state in diagd, and the ports added/removed since your last call "
        "(hot-plug).",
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
        "Open a serial port (action=open, the default) and keep it open in the daemon: its output is read "
        "continuously, sliced into packets at idle gaps of idle_ms, and kept in the URC buffer between calls. "
        "Calling open again on an open port changes its settings; on a Disconnected port it reopens it. "
        "action=close releases it. The port belongs to the client that opened it; force=true takes over a "
        "port held by another connected client. dtr/rts set the lines (at open: before the port is opened, so "
        "dtr=false avoids the reset pulse many boards get).",
        {"port": _PORT,
         "action": {"enum": ["open", "close"], "default": "open"},
         "baudrate": {"type": "integer", "minimum": 50, "maximum": 16000000},
         "bytesize": {"type": "integer", "enum": [5, 6, 7, 8]},
         "parity": {"enum": ["N", "E", "O", "M", "S"], "description": "none, even, odd, mark, space"},
         "stopbits": {"type": "number", "enum": [1, 1.5, 2]},
         "rtscts": {"type": "boolean", "description": "RTS/CTS hardware flow control"},
         "xonxoff": {"type": "boolean", "description": "XON/XOFF software flow control"},
         "dsrdtr": {"type": "boolean", "description": "DSR/DTR hardware flow control"},
         "idle_ms": {"type": "integer", "minimum": 1, "maximum": 10000,
                     "description": "an idle gap this long ends a packet (default [serial] idle_ms, 50)"},
         "line_ending": {"enum": list(LINE_ENDINGS),
                         "description": "appended to utf8 payloads of send_data by default (default none)"},
         "dtr": {"type": "boolean"}, "rts": {"type": "boolean"},
         "force": {"type": "boolean", "default": False}},
        {"type": "object", "properties": {
            **_PORT_STATUS["properties"], "success": {"type": "boolean"}, "action": {"enum": ["open", "close"]},
            "outcome": {"enum": ["opened", "reconfigured", "reopened", "closed"]},
            "took_over_from": _NULLABLE_STR, "discarded_urc_packets": {"type": "integer"}},
         "required": ["success", "action", "outcome", "port", "state"]},
        required=("port",), title="Open, reconfigure or close a serial port", read_only=False, idempotent=False,
        timeout_s=60),
    "connection_status": _tool(
        "State of one port (Connected, Disconnected, Occupied: held by another client or program, Closed) or, "
        "without port, of every port open in diagd: owner, settings, bytes in/out, pending and dropped URC "
        "packets, raw log file. For a port diagd has not opened it lists the processes holding it.",
        {"port": _PORT},
        {"type": "object", "properties": {"ports": {"type": "array", "items": _PORT_STATUS}}, "required": ["ports"]},
        title="Serial connection status"),
    "send_data": _tool(
        "Write payload to an open port and collect the reply. wait_policy=keyword: read until one of "
        "stop_pattern appears (e.g. ['OK\\r\\n', 'ERROR\\r\\n'], or '> ' for a prompt); on timeout return what "
        "arrived with timed_out=true. timeout: wait timeout_ms and return everything received in it. none: return "
        "once written; later output goes to the URC buffer. Default: keyword if stop_pattern is given, else "
        "timeout. The reply is the bytes received after the write, up to the end of the matched pattern (and "
        "the CR/LF right after it); what follows goes to the URC buffer. In utf8 payload and stop_pattern the "
        f"tool reads backslash escapes: {ESCAPES_HELP}; a backslash and r, or a real CR, send the same byte "
        "(escapes=false sends backslashes as they are). encoding=hex: payload (and stop_pattern, "
        "unless stop_pattern_encoding says otherwise) are hex ('0A 0D FF'). data is UTF-8 text when it is clean "
        "text, else uppercase hex (format says which). "
        "Replies past [serial] max_reply_bytes are cut (truncated=true); the raw log keeps every byte "
        "(get_log from log_offset). The tool never interprets the reply: success means written and waited.",
        {"port": _PORT,
         "payload": {"type": "string",
                     "description": f"text (utf8, escapes: {ESCAPES_HELP}) or hex bytes; empty: write nothing, "
                                    "just listen"},
         "encoding": {"enum": ["utf8", "hex"], "default": "utf8"},
         "wait_policy": {"enum": ["keyword", "timeout", "none"]},
         "stop_pattern": {"type": ["string", "array"], "items": {"type": "string", "minLength": 1},
                          "minLength": 1, "minItems": 1, "maxItems": 8,
                          "description": "one pattern or a list (the first to complete ends the wait); utf8 "
                                         "patterns take the payload's escapes, e.g. 'OK\\r\\n'"},
         "stop_pattern_encoding": {"enum": ["utf8", "hex"],
                                   "description": "how stop_pattern is written (default: encoding), e.g. hex "
                                                  "for a binary terminator after a text command"},
         "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 300000, "default": 1000},
         "line_ending": {"enum": list(LINE_ENDINGS),
                         "description": "appended to a utf8 payload (default: the port's line_ending)"},
         "escapes": {"type": "boolean", "default": True,
                     "description": "read backslash escapes in utf8 payload and stop_pattern; false sends "
                                    "backslashes as they are (e.g. a shell command for a board's console)"},
         "as_hex": _AS_HEX},
        {"type": "object", "properties": {
            "success": {"type": "boolean"}, "port": {"type": "string"}, "wait_policy": {"type": "string"},
            "data": {"type": "string"}, "format": {"enum": ["text", "hex"]}, "is_hex": {"type": "boolean"},
            "bytes_sent": {"type": "integer"}, "bytes_received": {"type": "integer"},
            "found_keyword": {"type": "boolean"}, "stop_pattern_matched": _NULLABLE_STR,
            "timed_out": {"type": "boolean"}, "truncated": {"type": "boolean"},
            "pending_urc_count": {"type": "integer"}, "urc_dropped": {"type": "integer"},
            "elapsed_ms": {"type": "number"}, "log_offset": {"type": ["integer", "null"]}, "note": {"type": "string"}},
         "required": ["success", "port", "data", "format", "is_hex", "bytes_sent", "bytes_received", "found_keyword",
                      "timed_out", "truncated", "pending_urc_count", "elapsed_ms"]},
        required=("port", "payload"), title="Send data to a serial port", read_only=False, idempotent=False,
        timeout_s=330),
    "read_urc": _tool(
        "Unsolicited packets (URCs, heartbeats, logs) that arrived while no send_data call was waiting, oldest "
        "first, each with its wall-clock timestamp and format. Consumes them unless peek=true. dropped counts "
        "packets lost to URC buffer overflow since the last read (the raw log still has their bytes).",
        {"port": _PORT, "max_packets": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50},
         "peek": {"type": "boolean", "default": False}, "as_hex": _AS_HEX},
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
        "Line control on an open port, e.g. to reset or boot-strap a board: set DTR and/or RTS, and/or hold a "
        "break condition for break_ms. Ports without modem lines (ptys, some adapters) give BACKEND_UNAVAILABLE.",
        {"port": _PORT, "dtr": {"type": "boolean"}, "rts": {"type": "boolean"},
         "break_ms": {"type": "integer", "minimum": 1, "maximum": 10000}},
        {"type": "object", "properties": {
            "success": {"type": "boolean"}, "port": {"type": "string"}, "dtr": {"type": ["boolean", "null"]},
            "rts": {"type": ["boolean", "null"]}, "break_ms": {"type": ["integer", "null"]},
            "modem_lines": {"type": ["object", "null"]}},
         "required": ["success", "port"]},
        required=("port",), title="Set serial control lines", read_only=False, idempotent=False),
    "get_log": _tool(
        "Page through the raw Tx/Rx log of a port's current (or last) session: every byte written and read, "
        "with wall-clock timestamps and direction, plus session events. Records are numbered from 0 (the "
        "session header); follow next_offset.",
        {"port": _PORT, "offset": {"type": "integer", "minimum": 0, "default": 0},
         "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}, "as_hex": _AS_HEX},
        {"type": "object", "properties": {
            "port": {"type": "string"}, "log_file": {"type": "string"}, "live": {"type": "boolean"},
            "offset": {"type": "integer"}, "returned": {"type": "integer"}, "total_records": {"type": "integer"},
            "next_offset": {"type": ["integer", "null"]}, "records": {"type": "array", "items": {
                "type": "object", "properties": {"i": {"type": "integer"}, "dir": {"enum": ["tx", "rx", "event"]}},
                "required": ["i", "dir"]}}},
         "required": ["port", "log_file", "offset", "returned", "total_records", "next_offset", "records"]},
        required=("port",), title="Read the raw serial log"),
}
