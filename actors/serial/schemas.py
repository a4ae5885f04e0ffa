"""The serial tools' descriptions and input schemas (pure data), by tool name: `TOOLS[name]` is what
tools.py passes to `ToolSet.tool` (what each returns is its reply model, replies.py)."""

from __future__ import annotations

from typing import Any

from diagd.actors.serial.codec import ESCAPES_HELP
from diagd.actors.serial.settings import LINE_ENDINGS
from diagd.actors.tooling import paging

_PORT = {"type": "string", "minLength": 1, "description": "/dev/ttyUSB0 or ttyUSB0"}
_AS_HEX = {"type": "boolean", "default": False, "description": "data as hex even if text"}
def _tool(description: str, properties: dict[str, Any], *, required: tuple[str, ...] = (),
          title: str, read_only: bool = True, idempotent: bool = True, destructive: bool = False,
          timeout_s: float | None = None) -> dict[str, Any]:
    """The keyword arguments of `ToolSet.tool` for one tool (tools.py declares it with them)."""
    return {"description": description, "props": properties, "required": required,
            "title": title, "read_only": read_only, "idempotent": idempotent, "destructive": destructive,
            "timeout_s": timeout_s}


TOOLS: dict[str, dict[str, Any]] = {
    "list_ports": _tool(
        "Every serial port (description, hardware id), whether allowed, its state, and ports added/removed "
        "since your last call.",
        {},
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
        required=("port",), title="Open, reconfigure or close a serial port", read_only=False, idempotent=False,
        timeout_s=60),
    "connection_status": _tool(
        "State, owner, settings and counters of one port (or of every open one); for a port diagd has not "
        "opened, the processes holding it.",
        {"port": _PORT},
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
        required=("port", "payload"), title="Send data to a serial port", read_only=False, idempotent=False,
        timeout_s=330),
    "read_urc": _tool(
        "Output that arrived while no send_data waited (URCs, logs), as timestamped packets, oldest first.",
        {"port": _PORT,
         "max_packets": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50, "description": "at most"},
         "peek": {"type": "boolean", "default": False, "description": "leave them buffered"}, "as_hex": _AS_HEX},
        required=("port",), title="Read unsolicited serial output", read_only=False, idempotent=False),
    "set_signals": _tool(
        "Set DTR/RTS and/or send a break, e.g. to reset a board.",
        {"port": _PORT, "dtr": {"type": "boolean", "description": "DTR level"},
         "rts": {"type": "boolean", "description": "RTS level"},
         "break_ms": {"type": "integer", "minimum": 1, "maximum": 10000, "description": "break this long"}},
        required=("port",), title="Set serial control lines", read_only=False, idempotent=False),
    "get_log": _tool(
        "Page the raw Tx/Rx log of the port's current or last session (every byte, timestamped); follow "
        "next_offset.",
        {"port": _PORT, **paging(limit=100, maximum=1000), "as_hex": _AS_HEX},
        required=("port",), title="Read the raw serial log"),
    "export_serial_pcapng": _tool(
        "A session's raw log as pcapng for the pcap tools (a packet per Tx/Rx chunk; frame.p2p_dir 0=Tx, 1=Rx), "
        "written to diagd's exports dir; the answer's pcapng_path names it.",
        {"port": _PORT, "session": {"type": "string", "description": "log name; default: the current or last"},
         "name": {"type": "string",
                  "description": "file stem [A-Za-z0-9._-], no extension (.pcapng is added)"}},
        required=("port",), title="Serial session to pcapng", read_only=False, idempotent=False,
        timeout_s=600),
}
