"""`pcap_sequence_diagram`: the frames of a UE context, a PDU session, a followed flow or a filter as Mermaid.

The selection becomes one display filter; the rows come from the capture's actor as `pcap_timeline`
gets them (`tshark -T fields` itself), and sequence.py draws them. Kept apart from tools.py, which is
near the module size limit; tools.register binds this ToolSet with the others.
"""

from __future__ import annotations

import difflib
from typing import Any, cast

from diagd.actors.pcap import sequence
from diagd.actors.pcap.backend import PcapBackend
from diagd.actors.pcap.capture import CaptureSpec
from diagd.actors.pcap.messages import Follow, NgapSessions, PduSessions, Timeline
from diagd.actors.pcap.replies import SequenceReply
from diagd.actors.pcap.schemas import CAPTURE, FILTER
from diagd.actors.tooling import CallContext, ToolSet
from diagd.protocol.errors import DiagdError, ErrorCode

tools: ToolSet[PcapBackend] = ToolSet()
Args = dict[str, Any]
# NGAP UE ids are unique per SCTP association (Wireshark numbers them), and NAS after Security Mode
# Command only names its messages when deciphered with NEA0: the same preferences as ngap_ue_sessions.
PREFS = {"sctp.association_index": "TRUE", "nas-5gs.null_decipher": "TRUE"}
HINT = ("give ue (a UE context from ngap_ue_sessions, optionally with pdu_session_id), frame_number (follow "
        "its HTTP/2 stream, Diameter Session-Id or SIP Call-ID) or display_filter")


def _frames_filter(frames: list[int]) -> str:
    return f"frame.number in {{{','.join(map(str, sorted(set(frames))))}}}"


def _session_frames(value: Any) -> list[int]:
    """Every frame number a PDU session entry names (its *_frame keys, failures, release)."""
    found: list[int] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if key.endswith("frame") and isinstance(item, int):
                found.append(item)
            elif isinstance(item, dict | list):
                found += _session_frames(item)
    elif isinstance(value, list):
        for item in value:
            found += _session_frames(item)
    return found


async def _ue_filter(backend: PcapBackend, ctx: CallContext, spec: CaptureSpec, args: Args) -> tuple[str, Args]:
    ue, psi = args["ue"], args.get("pdu_session_id")
    contexts = (await backend.ask(ctx, spec, NgapSessions("")))["ues"]
    labels = [u["ue"] for u in contexts]
    if ue not in labels:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"no UE context {ue!r} in this capture",
                         did_you_mean=difflib.get_close_matches(ue, labels, n=5, cutoff=0.3) or labels[:10],
                         hint="UE contexts are the 'ue' values of ngap_ue_sessions")
    if psi is None:
        frames = next(u["frames"] for u in contexts if u["ue"] == ue)
        return _frames_filter(frames), {"ue": ue}
    sessions = [s for s in (await backend.ask(ctx, spec, PduSessions("")))["sessions"] if s["ue"] == ue]
    mine = [s for s in sessions if s["pdu_session_id"] == psi]
    if not mine:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"UE context {ue!r} has no PDU session {psi}",
                         pdu_session_ids=sorted({s["pdu_session_id"] for s in sessions}))
    # The session's verdict is the one procedure model's (as in ngap_pdu_session_summary): its latest
    # establishment's outcome and the rule that decided it.
    verdict = {k: mine[-1].get(k) for k in ("outcome", "rule", "status")}
    return _frames_filter(_session_frames(mine)), {"ue": ue, "pdu_session_id": psi, **verdict}


async def _selection(backend: PcapBackend, ctx: CallContext, spec: CaptureSpec, args: Args) -> tuple[str, Args]:
    """(display filter of the chosen frames, what was chosen)."""
    flt = args["display_filter"]
    if "pdu_session_id" in args and "ue" not in args:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "pdu_session_id needs ue", hint=HINT)
    if "ue" in args and "frame_number" in args:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "give ue or frame_number, not both", hint=HINT)
    if "ue" in args:
        chosen, what = await _ue_filter(backend, ctx, spec, args)
    elif "frame_number" in args:
        followed = await backend.ask(ctx, spec, Follow(args["frame_number"], "", 1, 0))
        chosen, what = followed["follow_display_filter"], {"follow": followed["follow_key"]}
    elif flt:
        return flt, {"display_filter": flt}
    else:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "nothing selected", hint=HINT)
    if flt:
        return f"({chosen}) && ({flt})", {**what, "display_filter": flt}
    return chosen, what


# The shared capture fragment without include_command: the answer always names its tshark command.
SMALL_CAPTURE = {k: v for k, v in CAPTURE.items() if k != "include_command"}


@tools.tool("pcap_sequence_diagram", "Mermaid sequenceDiagram of a UE context, a PDU session, a frame's flow "
            "or a filter.",
            {**SMALL_CAPTURE, **FILTER, "ue": {"type": "string", "description": "from ngap_ue_sessions"},
             "pdu_session_id": {"type": "integer", "description": "of ue"},
             "frame_number": {"type": "integer", "minimum": 1, "description": "its flow"},
             "max_arrows": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100,
                            "description": "at most"}},
            required=("pcap_path",))
async def sequence_diagram(backend: PcapBackend, ctx: CallContext, args: Args) -> SequenceReply:
    spec = await backend.spec_for(args, force_prefs=PREFS)
    flt, selected = await _selection(backend, ctx, spec, args)
    limit = args["max_arrows"]
    fields = ("frame.number", *sequence.FIELDS)
    answer = await backend.ask(ctx, spec, Timeline(flt, fields, limit, 0, None, await backend.kinds(flt, *fields)))
    drawn = sequence.build(answer["rows"])
    total = answer["total"]
    verdict: Args = {k: selected.pop(k) for k in ("outcome", "rule", "status") if k in selected}
    result: Args = {"diagram": drawn.mermaid(), **drawn.describe(), **verdict, "frames_matched": total,
                    "left_out": total - len(answer["rows"]), "selection": selected, "display_filter": flt,
                    "warnings": []}
    if result["left_out"]:
        result["warnings"].append(f"cut at max_arrows={limit}: {total} frames match, the first {limit} are drawn; "
                                  "narrow display_filter or raise max_arrows")
    if drawn.skipped:
        result["warnings"].append(f"frames without an IP source and destination are not drawn: {drawn.skipped[:20]}")
    if not total:
        result["reason"] = answer.get("hint") or "no frame matches the selection"
    command = ["-Y", flt, "-T", "fields", *[a for f in fields for a in ("-e", f)]]
    return cast(SequenceReply, {**result, "source": await backend.source(
        spec, {**args, "include_command": True}, display_filter=flt, command=command)})
