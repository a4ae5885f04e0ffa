"""The answers to the pcap tools' questions, each built from one loaded capture inside the actor's call:
packet lists, exports and timelines (answers.py), frame text and text search (text.py, text_scan.py),
follows (follow.py), Wireshark's statistics and response times (stats.py, pairing.py, http2_srt.py),
sequence diagrams (sequence.py), field search (field_search.py) and what the NGAP summaries leave out
(left_out.py). The top layer: it may import every other subpackage (engine/, warm/, ngap/, masking/,
shark/) and the actor's questions (messages.py), never the actor, the back end or the tools, which
import it (the layers contract in pyproject.toml's [tool.importlinter]).
"""
