"""Wireshark's own programs and what they print, the bottom layer of the pcap back end: the `sharkd`
worker protocol (sharkd.py), cold tshark and capinfos passes (tshark.py, halves.py), the field catalogue
and decode-as rules (wireshark.py, fieldtable.py, decode_check.py), what they said kept in one object
the back end owns (facts.py: `Wireshark`), and the shapes of their output (tree.py: protocol trees;
single_pass_text.py: single-pass `tshark -V` text; rows.py: packet-list rows and `-T fields` cells). It
may import nothing of the pcap package but messages.py (today it imports none); every layer above imports
it (the layers contract in pyproject.toml's [tool.importlinter]).
"""
