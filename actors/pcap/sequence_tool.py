"""`pcap_sequence_diagram`: the frames of a UE context, a PDU session, a followed flow or a filter as Mermaid.

A followed flow or a filter is one display filter. A UE context or PDU session is a list of frames,
which can be longer than any filter sharkd takes (MAX_FILTER_CHARS): it is written as runs
(`frame.number in {3..9,12}`) and asked in as many parts as it needs, each under the limit, only as
far as the page (offset, max_arrows) reaches. The rows come from the capture's actor as `pcap_timeline`
gets them (`tshark -T fields` itself), and sequence.py draws them. Kept apart from tools.py, which is
near the module size limit; tools.register binds this ToolSet with the others.
"""

from __future__ import annotations

import difflib
from typing import Any, NotRequired

from diagd.actors.pcap.answers import sequence
from diagd.actors.pcap.backend import PcapBackend
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.engine.session import MAX_FILTER_CHARS
from diagd.actors.pcap.messages import Follow, NgapProcedures, NgapSessions, PduSessions, Timeline
from diagd.actors.pcap.replies import SequenceReply
from diagd.actors.pcap.schemas import CAPTURE, FILTER
from diagd.actors.tooling import CallContext, ToolSet
from diagd.protocol.errors import DiagdError, ErrorCode

tools: ToolSet[PcapBackend] = ToolSet()
Args = dict[str, Any]
# NGAP UE ids are unique per SCTP association (Wireshark numbers them), and NAS after Security Mode
# Command only names its messages when deciphered with NEA0: the same preferences as ngap_ue_sessions.
PREFS = {"sctp.association_index": "TRUE", "nas-5gs.null_decipher": "TRUE"}
HINT = ("give ue (a UE context from ngap_ue_sessions, optionally with pdu_session_id), frame_number (its flow as "
        "pcap_follow picks it: HTTP/2 stream, Diameter Session-Id, SIP Call-ID, GTPv2-C tunnel, TCP or UDP stream) "
        "or display_filter")


def _runs(frames: list[int]) -> list[str]:
    """Sorted distinct frame numbers as set members: '7' or a run of consecutive ones '3..9'."""
    out: list[str] = []
    numbers = sorted(set(frames))
    start = 0
    for i in range(1, len(numbers) + 1):
        if i == len(numbers) or numbers[i] != numbers[i - 1] + 1:
            first, end = numbers[start], numbers[i - 1]
            out.append(str(first) if first == end else f"{first}..{end}")
            start = i
    return out


def _frames_filter(members: list[str], flt: str = "") -> str:
    chosen = f"frame.number in {{{','.join(members)}}}"
    return f"({chosen}) && ({flt})" if flt else chosen


def frame_parts(frames: list[int], flt: str = "") -> list[tuple[str, int]]:
    """(display filter, frames it names) parts of a frame list, in frame order, each filter at most
    MAX_FILTER_CHARS long: never a filter diagd itself (or sharkd's 2 KiB request line) refuses."""
    parts: list[tuple[str, int]] = []
    members: list[str] = []
    for member in _runs(frames):
        if members and len(_frames_filter([*members, member], flt)) > MAX_FILTER_CHARS:
            parts.append((_frames_filter(members, flt), _count(members)))
            members = []
        members.append(member)
    if members:
        parts.append((_frames_filter(members, flt), _count(members)))
    if any(len(f) > MAX_FILTER_CHARS for f, _ in parts):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"display_filter is too long to combine with the selected "
                         f"frames: together they exceed {MAX_FILTER_CHARS} characters", length=len(flt),
                         hint="shorten display_filter")
    return parts


def _count(members: list[str]) -> int:
    return sum(int(m.split("..")[1]) - int(m.split("..")[0]) + 1 if ".." in m else 1 for m in members)


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


def decided(procedures: list[Args]) -> dict[int, list[str]]:
    """frame -> the reject and failure verdicts it decided (an instance's last message closed it by its rule),
    each with its rule id, clause and text. An incomplete one rests on a message that never came."""
    found: dict[int, list[str]] = {}
    for p in procedures:
        if p.get("outcome") in ("reject", "failure"):
            found.setdefault(p["last_frame"], []).append(
                f"{p['procedure']} {p['outcome']}: rule {p['rule_id']}, {p['rule']}")
    return found


def core_frames(procedures: list[Args]) -> list[int]:
    """The PFCP and SBI request and response frames linked to the procedures (their `n4_sbi`)."""
    return [f for p in procedures for m in p.get("n4_sbi", [])
            for f in (m.get("frame"), m.get("response_frame")) if isinstance(f, int)]


async def _ue_frames(backend: PcapBackend, ctx: CallContext, spec: CaptureSpec,
                    args: Args) -> tuple[list[int], Args, list[Args]]:
    """(the frames, what was selected, the procedure instances drawn: their verdicts and N4/SBI links)."""
    ue, psi = args["ue"], args.get("pdu_session_id")
    contexts = (await backend.ask(ctx, spec, NgapSessions("")))["ues"]
    labels = [u["ue"] for u in contexts]
    if ue not in labels:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"no UE context {ue!r} in this capture",
                         did_you_mean=difflib.get_close_matches(ue, labels, n=5, cutoff=0.3) or labels[:10],
                         hint="UE contexts are the 'ue' values of ngap_ue_sessions")
    # The one procedure model's instances (as ngap_ue_sessions view=procedures gives them, N4/SBI linked).
    viewed = (await backend.ask(ctx, spec, NgapProcedures("")))["ues"]
    procedures = [p for u in viewed if u["ue"] == ue for p in u["procedures"]]
    if psi is None:
        return list(next(u["frames"] for u in contexts if u["ue"] == ue)), {"ue": ue}, procedures
    sessions = [s for s in (await backend.ask(ctx, spec, PduSessions("")))["sessions"] if s["ue"] == ue]
    mine = [s for s in sessions if s["pdu_session_id"] == psi]
    if not mine:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"UE context {ue!r} has no PDU session {psi}",
                         pdu_session_ids=sorted({s["pdu_session_id"] for s in sessions}))
    # The session's verdict is the one procedure model's (as in ngap_pdu_session_summary): its latest
    # establishment's outcome and the rule that decided it. Its diagram draws every message a verdict of
    # the session's procedures rests on (a 5GMM STATUS names no session: the model gave it to this one)
    # and the PFCP and SBI messages linked to them.
    verdict = {k: mine[-1].get(k) for k in ("outcome", "rule", "status")}
    procedures = [p for p in procedures if p.get("pdu_session_id") == psi]
    frames = _session_frames(mine) + [f for p in procedures for f in p["frames"]] + core_frames(procedures)
    return frames, {"ue": ue, "pdu_session_id": psi, **verdict}, procedures


async def _selection(backend: PcapBackend, ctx: CallContext, spec: CaptureSpec,
                     args: Args) -> tuple[list[int] | None, str, Args, list[Args]]:
    """(the chosen frames, or None for every frame, the display filter they must also match, what was chosen,
    the procedure instances of a UE or PDU session selection)."""
    flt = args["display_filter"]
    if "pdu_session_id" in args and "ue" not in args:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "pdu_session_id needs ue", hint=HINT)
    if "ue" in args and "frame_number" in args:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "give ue or frame_number, not both", hint=HINT)
    if "ue" in args:
        frames, what, procedures = await _ue_frames(backend, ctx, spec, args)
        return frames, flt, {**what, "display_filter": flt} if flt else what, procedures
    if "frame_number" in args:
        followed = await backend.ask(ctx, spec, Follow(args["frame_number"], "", 1, 0))
        chosen, what = followed["follow_display_filter"], {"follow": followed["follow_key"]}
        if flt:
            return None, f"({chosen}) && ({flt})", {**what, "display_filter": flt}, []
        return None, chosen, what, []
    if flt:
        return None, flt, {"display_filter": flt}, []
    raise DiagdError(ErrorCode.INVALID_ARGUMENT, "nothing selected", hint=HINT)


async def _rows(backend: PcapBackend, ctx: CallContext, spec: CaptureSpec, parts: list[tuple[str, int]],
                exact: bool, limit: int, offset: int) -> tuple[list[dict[str, Any]], int, str | None]:
    """(rows offset.. offset + limit of the parts' frames in order, how many frames match in all, the actor's
    hint when none does). A part
    past the page is asked only for its count, and not at all when its frames all match (`exact`)."""
    fields = ("frame.number", *sequence.FIELDS)
    rows: list[dict[str, Any]] = []
    total, hint = 0, None
    for flt, named in parts:
        skip = max(0, offset - total)
        if exact and (len(rows) >= limit or skip >= named):
            total += named
            continue
        want = limit - len(rows)
        # Past the page: an offset beyond the part's frames makes the actor count without reading a row.
        answer = await backend.ask(ctx, spec, Timeline(flt, fields, max(want, 1), skip if want > 0 else named,
                                                       None, await backend.kinds(flt, *fields)))
        rows += answer["rows"][:max(want, 0)]
        total += answer["total"]
        hint = hint or answer.get("hint")
    return rows, total, None if total else hint


# The shared capture fragment without include_command: the answer always names its tshark command.
SMALL_CAPTURE = {k: v for k, v in CAPTURE.items() if k != "include_command"}


@tools.tool("pcap_sequence_diagram", "Mermaid diagram of a UE, PDU session, frame's flow or filter.",
            {**SMALL_CAPTURE, **FILTER, "ue": {"type": "string", "description": "from ngap_ue_sessions"},
             "pdu_session_id": {"type": "integer", "description": "of ue"},
             "frame_number": {"type": "integer", "minimum": 1, "description": "its flow"},
             "max_arrows": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100,
                            "description": "at most"},
             "offset": {"type": "integer", "minimum": 0, "default": 0, "description": "to skip"}},
            required=("pcap_path",), ui="ui://diagd/ladder")
async def sequence_diagram(backend: PcapBackend, ctx: CallContext, args: Args) -> SequenceReply:
    spec = await backend.spec_for(args, force_prefs=PREFS)
    frames, flt, selected, procedures = await _selection(backend, ctx, spec, args)
    limit, offset = args["max_arrows"], args["offset"]
    parts = frame_parts(frames, flt) if frames is not None else [(flt, 0)]
    rows, total, hint = await _rows(backend, ctx, spec, parts, frames is not None and not flt, limit, offset)
    shown = _frames_filter(_runs(frames), flt) if frames is not None else flt
    drawn = sequence.build(rows, decided(procedures))
    verdict: Args = {k: selected.pop(k) for k in ("outcome", "rule", "status") if k in selected}
    after = offset + len(rows)
    described = drawn.describe()
    fields = ("frame.number", *sequence.FIELDS)
    command = ["-Y", shown, "-T", "fields", *[a for f in fields for a in ("-e", f)]]
    result: _SequenceShown = {
        "diagram": drawn.mermaid(), "participants": described["participants"], "arrows": described["arrows"],
        "messages": described["messages"], "failures": described["failures"], "frames_matched": total,
        "offset": offset, "left_out": total - len(rows), "next_offset": after if after < total else None,
        "selection": selected, "display_filter": shown, "warnings": [],
        "source": await backend.source(spec, {**args, "include_command": True}, display_filter=shown,
                                       command=command)}
    if "outcome" in verdict:
        result["outcome"] = verdict["outcome"]
    if "rule" in verdict:
        result["rule"] = verdict["rule"]
    if "status" in verdict:
        result["status"] = verdict["status"]
    if not ctx.views:  # the arrows as data are the ladder view's (docs/views.md); the model reads `diagram`
        del result["messages"]
    if "pdu_session_id" in selected:
        result["n4_sbi"] = [m for p in procedures for m in p.get("n4_sbi", [])]
    if after < total:
        result["warnings"].append(f"cut at max_arrows={limit}: {total} frames match, frames {offset + 1}..{after} "
                                  f"of them are drawn; offset={after} draws the next ones, or narrow display_filter")
    if len(parts) > 1:
        result["warnings"].append(f"the {len(frames or [])} selected frames were asked in {len(parts)} filters "
                                  f"of at most {MAX_FILTER_CHARS} characters (sharkd's request limit); "
                                  "display_filter is their union, for tshark")
    if drawn.skipped:
        result["warnings"].append(f"frames without an IP source and destination are not drawn: {drawn.skipped[:20]}")
    if not total:
        result["reason"] = hint or "no frame matches the selection"
    return result


class _SequenceShown(SequenceReply):
    """pcap_sequence_diagram's reply as built: the arrow count and a PDU session's verdict beyond the model's keys."""

    arrows: int
    outcome: NotRequired[str | None]
    rule: NotRequired[str | None]
    status: NotRequired[str | None]
