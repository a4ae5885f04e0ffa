"""The pcap back end: one warm `sharkd` worker per capture, on Wireshark's own dissectors.

`register(runtime)` declares its tools (tools.py); the actor (actor.py) owns one loaded capture.
Helpers: sharkd.py (the worker protocol), tshark.py (cold tshark/capinfos passes), wireshark.py (the
field catalogue, decode-as rules), tree.py (protocol trees as tshark -V text), ngap (N2 summaries),
mask.py (subscriber-identity masking at the tool boundary), field_search.py (pcap_list_fields).
"""

from diagd.actors.pcap.settings import PcapSettings
from diagd.actors.pcap.tools import register
from diagd.actors.system import Needs, Tool

__all__ = ["SYSTEM_NEEDS", "PcapSettings", "register"]

# What `diagd setup pcap` installs and `diagd doctor` checks.
SYSTEM_NEEDS = Needs(tools=(Tool("tshark", ("-v",), "tshark"), Tool("sharkd", ("-v",), "wireshark-common"),
                            Tool("capinfos", ("-v",), "wireshark-common")))
