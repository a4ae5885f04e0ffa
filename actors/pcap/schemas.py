"""The pcap tools' shared input schema fragments (what each tool returns is a model: replies.py)."""

from __future__ import annotations

from typing import Any

from diagd.actors.tooling import display_filter, paging

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
