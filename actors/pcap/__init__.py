"""The pcap back end: one warm `sharkd` worker per capture, on Wireshark's own dissectors.

`register(runtime)` declares its tools (tools.py); the actor (actor.py) owns one loaded capture.
Beside them at the top: the back end's state (backend.py), the actor's questions (messages.py), the
replies and schemas, settings.py, ngap_tools.py, sequence_tool.py and timeline_source.py. The helpers are layered
subpackages, each importing only those below it (the layers contract in pyproject.toml):
answers/ (each tool's answer from a loaded capture) > engine/ (sharkd workers, filter passes, caches)
> warm/ (early-stopping and warm tsharks) > ngap/ (N2 summaries) | masking/ (subscriber-identity
masking at the tool boundary) > shark/ (sharkd, tshark, the field catalogue, protocol trees).
"""

from diagd.actors.pcap import timeline_source, tools
from diagd.actors.pcap.backend import PcapBackend
from diagd.actors.pcap.settings import PcapSettings
from diagd.actors.pcap.shark import recordwalk
from diagd.actors.runtime import Runtime
from diagd.actors.system import Check, Needs, Tool

__all__ = ["INSTRUCTIONS", "SYSTEM_NEEDS", "PcapSettings", "register"]



def _check_record_walker() -> Check:
    if recordwalk.available():
        return Check("record walker", True, "pcap_info counts a pcap/pcapng from its record headers (C)")
    return Check("record walker", False, "not built: pcap_info waits for capinfos' whole read of a capture",
                 "reinstall diagd with a C compiler and Python headers (apt: gcc python3-dev)")


# What `diagd setup pcap` installs and `diagd doctor` checks.
SYSTEM_NEEDS = Needs(tools=(Tool("tshark", ("-v",), "tshark"), Tool("sharkd", ("-v",), "wireshark-common"),
                            Tool("capinfos", ("-v",), "wireshark-common")), checks=(_check_record_walker,))

# Its paragraph of the MCP server instructions.
INSTRUCTIONS = """\
pcap (5G core / RAN captures, Wireshark's dissectors):
1. pcap_info: protocols present, conversations (SCTP/N2 first), time span.
2. ngap_ue_sessions: per UE the procedures, NAS messages and failures with causes (view="procedures":
   each procedure's duration and outcome, with p50/p95 latencies); then ngap_pdu_session_summary for
   PDU sessions (N3 tunnels, QFIs, DNN, UE IP, 5GSM causes).
3. pcap_timeline with a display filter and fields to line the facts up (raw values, arrays for
   bundled PDUs); pcap_frames_by_filter to list frames; an empty result says whether the protocol
   occurs at all.
4. pcap_frame_detail on the failing frame numbers, layers=["nas-5gs"] or ["ngap"] to stay short.
5. pcap_follow for a SIP Call-ID, a Diameter Session-Id or an HTTP/2 stream; pcap_text_search for
   a string in the decoded text; pcap_extract_subcapture to share the evidence.
6. pcap_sequence_diagram (Mermaid) for a UE, a PDU session, a flow or a filter; pcap_stats for
   Wireshark's expert info, response times, conversations, endpoints and I/O series.
Quirks: HTTP/2 SBI on a non-standard port needs decode_as="tcp.port==7777,http2" (applied only to the
conversations that carry HTTP/2; pcap_info says which port needs it); NAS after Security
Mode (NEA0) needs profile="5gc-lab" (nas-5gs.null_decipher); ngap_* tools enable it by default.
Field names: pcap_list_fields / pcap_fields_search.
"""


def register(runtime: Runtime) -> PcapBackend:
    backend = tools.register(runtime)
    runtime.set_instructions(INSTRUCTIONS)
    runtime.add_timeline_source(timeline_source.SOURCE)  # pcap re-reads its table per call: nothing to defer
    runtime.add_status(backend.status_section)  # the capture indexes on disk
    return backend
