"""A live capture answers as the file that was sent: real corpus captures carrying NGAP, PFCP, GTP-U and
SIP replayed with tcpreplay onto a veth pair, captured by real dumpcap through a real daemon, then
ngap_ue_sessions (both views), pcap_stats (every kind, the protocols each carries) and
pcap_sequence_diagram asked on `capture:<id>` and on the file the frames came from, and the answers
compared field by field.

The frames are checked first to be the very bytes sent (length and sha256 of each, read here from
both files): what may differ then is only what the replay changed, the packets' timing. Those fields
are left out by name (TIMING, each with why), and so is what Wireshark decides from timing inside a
value (TCP retransmission or out-of-order, a diagram's pause notes: `untimed`); `source` names the
file read. Everything else is compared exactly: about 5,100 fields over the four captures (printed
per answer with -s), at least 100 per capture asserted, so an answer that lost its rows cannot pass
as equal. Independently, tshark counts each protocol's frames in the file sent."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess
from tests.e2e.test_mcp import mcp_client
from tests.e2e.test_serial import ok
from tests.pcaps import PCAPS, PCAPS_EXTRA
from tests.support.pcapedit import to_ethernet
from tests.support.veth import Veth, frames

pytestmark = pytest.mark.e2e

# Fields whose value depends on when the packets arrived, not on their bytes. tcpreplay sends at a
# fixed rate (REPLAY_PPS), so a capture's timestamps are the replay's, never the original's.
TIMING = {
    # ngap_ue_sessions: a UE's first and last packet times and the span between them; a procedure's start
    # and duration, its N4/SBI messages' times and latencies; the per-procedure latency percentiles
    "first_time", "last_time", "duration_s", "start", "duration_ms", "time", "latency_ms", "p50_ms", "p95_ms",
    "max_ms",
    # pcap_stats conversations: when each began (relative to the first frame) and how long it lasted
    "rel_start_s",
    # pcap_stats srt: the request-to-response times
    "min_s", "max_s", "avg_s", "sum_s",
}
# Also timing, though not a field of its own: Wireshark tells a TCP segment sent again as a retransmission
# or as out-of-order by the time since the last segment (tcp_analyze_sequence_number), so the frames of the
# two expert items move between them with the replay's timing (seen: 14/14 in the file, 17/11 captured).
# `untimed` compares the sum of their counts, and the severity totals without them. And pcap_sequence_diagram adds a
# "Note over ...: +N s" line for a pause over 1 s and ten times the flow's median gap (sequence.py).
TCP_RESENT = ("This frame is a (suspected) retransmission", "This frame is a (suspected) out-of-order segment")
PAUSE_NOTE = re.compile(r"^\s*Note over [^:]+: \+[0-9.]+ s$")
# The same choice in an arrow's text (Wireshark's Info column), which the diagram then cuts at a fixed
# length: the line from the label on is left out, its frame number and ends are compared.
TCP_RESENT_LABEL = re.compile(r"\[TCP (?:Retransmission|Out-Of-Order)\].*$")
# `source` names the file each answer read (the capture's ring file or view, or the sent file).
NOT_COMPARED = TIMING | {"source"}

# io statistics in one bin longer than any replay: frames and bytes of the whole capture, with no
# bin boundary that the replay's timing could move a frame across.
ONE_BIN_MS = 10 ** 9


def sent_file(name: str, tmp: Path) -> Path:
    """The capture as it goes onto the wire: Ethernet as is, a Linux-cooked one given Ethernet headers."""
    for folder in (PCAPS, PCAPS_EXTRA):
        if (folder / name).exists():
            source = folder / name
            break
    else:
        pytest.skip(f"real capture {name} not found in {PCAPS} or {PCAPS_EXTRA} (set DIAGD_TEST_PCAPS)")
    encapsulation = subprocess.run(["capinfos", "-T", "-E", str(source)], capture_output=True, text=True,
                                   check=True).stdout.split("\t")[-1].strip()
    if encapsulation == "ether":
        return source
    converted = tmp / f"{source.stem}-ethernet.pcap"
    to_ethernet(source, converted)
    return converted


def untimed(answer: dict[str, Any]) -> dict[str, Any]:
    """`answer` without what the replay's timing decides (TCP_RESENT, PAUSE_NOTE), everything else kept."""
    answer = dict(answer)
    if "diagram" in answer:
        answer["diagram"] = "\n".join(TCP_RESENT_LABEL.sub("[TCP resent]", line)
                                      for line in answer["diagram"].splitlines() if not PAUSE_NOTE.match(line))
    if "messages" in answer:  # the diagram's arrows as data: the same labels
        answer["messages"] = [{**m, "label": TCP_RESENT_LABEL.sub("[TCP resent]", m["label"])}
                              for m in answer["messages"]]
    if answer.get("kind") == "expert":
        resent = [r for r in answer["rows"] if r["protocol"] == "TCP" and r["summary"] in TCP_RESENT]
        answer["rows"] = [r for r in answer["rows"] if r not in resent]
        answer["total"] -= len(resent)
        by_severity, by_protocol = dict(answer["by_severity"]), {k: dict(v) for k, v in answer["by_protocol"].items()}
        for row in resent:
            by_severity[row["severity"]] -= row["count"]
            by_protocol["TCP"][row["severity"]] -= row["count"]
        answer["by_severity"], answer["by_protocol"] = by_severity, by_protocol
        answer["tcp_resent"] = sum(r["count"] for r in resent)  # (`frames` lists only each item's first few)
    return answer


def leaves(answer: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every field that does not depend on timing (lists by index)."""
    if isinstance(answer, dict):
        for key, value in answer.items():
            if key not in NOT_COMPARED:
                yield from leaves(value, f"{path}.{key}")
    elif isinstance(answer, list):
        for i, value in enumerate(answer):
            yield from leaves(value, f"{path}[{i}]")
    else:
        yield path, answer


def compare(live: dict[str, Any], sent: dict[str, Any], what: str) -> int:
    """Every field of `live` equals the same field of `sent` (timing left out); returns how many."""
    got, want = dict(leaves(untimed(live))), dict(leaves(untimed(sent)))
    differ = {p: (got.get(p), want.get(p)) for p in got.keys() | want.keys() if got.get(p) != want.get(p)}
    assert not differ, (what, dict(sorted(differ.items())[:40]))
    return len(got)


async def questions(client: Any, ref: str) -> dict[str, dict[str, Any]]:
    """The answers of one capture, by question."""
    answers: dict[str, dict[str, Any]] = {}

    async def ask(key: str, tool: str, **args: Any) -> dict[str, Any]:
        answers[key] = await ok(client, tool, pcap_path=ref, **args)
        return answers[key]

    contexts = await ask("ngap_ue_sessions contexts", "ngap_ue_sessions", view="contexts")
    await ask("ngap_ue_sessions procedures", "ngap_ue_sessions", view="procedures")
    await ask("pcap_stats expert", "pcap_stats", kind="expert", limit=5000)
    for proto in ("eth", "ip", "tcp", "udp", "sctp"):
        await ask(f"pcap_stats conversations {proto}", "pcap_stats", kind="conversations", protocol=proto,
                  limit=5000)
        await ask(f"pcap_stats endpoints {proto}", "pcap_stats", kind="endpoints", protocol=proto, limit=5000)
    for proto in ("pfcp", "sip"):
        await ask(f"pcap_stats srt {proto}", "pcap_stats", kind="srt", protocol=proto, limit=5000)
    await ask("pcap_stats io", "pcap_stats", kind="io", interval_ms=ONE_BIN_MS, limit=5000)
    for flt in ("ngap", "pfcp", "gtp", "sip"):
        await ask(f"pcap_sequence_diagram {flt}", "pcap_sequence_diagram", display_filter=flt, max_arrows=1000)
    for ue in [c["ue"] for c in contexts["ues"]][:3]:
        await ask(f"pcap_sequence_diagram ue {ue}", "pcap_sequence_diagram", ue=ue, max_arrows=1000)
    return answers


def tshark_count(path: Path, display_filter: str) -> int:
    done = subprocess.run(["tshark", "-n", "-2", "-r", str(path), "-Y", display_filter, "-T", "fields",
                           "-e", "frame.number"], capture_output=True, text=True, check=True)
    return len(done.stdout.split())


CASES = {
    # 753 Ethernet frames: NGAP over SCTP, PFCP, GTP-U, HTTP/2; a ring of several files (a merged view)
    "5greplay_oai.pcap": {"file_size_kb": 100, "ring_files": 10},
    # 360 Linux-cooked frames (NGAP, PFCP, GTP-U carrying TCP, TLS and DNS), given Ethernet headers
    "oaifed_cotsue_core.pcap": {},
    # 84 frames: one SIP call over TCP with its RTP and RTCP
    "heplify_sip_ipv4_tcp.pcap": {},
    # 61 frames: SIP over WebSocket and over UDP
    "heplify_sip_tcp_websocket.pcap": {},
}
CARRIES = {"5greplay_oai.pcap": ("ngap", "pfcp", "gtp"), "oaifed_cotsue_core.pcap": ("ngap", "pfcp", "gtp"),
           "heplify_sip_ipv4_tcp.pcap": ("sip",), "heplify_sip_tcp_websocket.pcap": ("sip",)}


@pytest.mark.parametrize("name", list(CASES))
async def test_a_replayed_capture_answers_as_the_file_sent(
        capture_daemon: DaemonProcess, veth: Veth, tmp_path: Path, name: str) -> None:
    sent = sent_file(name, tmp_path)
    for protocol in CARRIES[name]:
        assert tshark_count(sent, protocol) > 0, (name, protocol)  # the case carries what it is here for
    expected = frames(sent, tmp_path)
    async with mcp_client(capture_daemon.env) as client:
        started = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=120, **CASES[name])
        await trio.to_thread.run_sync(veth.replay, str(sent))
        with trio.fail_after(30):
            while (await ok(client, "capture_status", capture_id=started["capture_id"]))["packets"] < len(expected):
                await trio.sleep(0.1)
        done = await ok(client, "stop_capture", capture_id=started["capture_id"])
        # No drop: dumpcap's kernel count, and every frame sent is in the capture (below). (The interface's own
        # count comes from the last file's statistics block, which dumpcap 4.0 does not write with -b.)
        assert done["drops"]["kernel"] == 0 and done["drops"]["interface"] in (0, None), done["drops"]
        ref = f"capture:{started['capture_id']}"
        view = (await ok(client, "pcap_info", pcap_path=ref))["source"]["pcap_path"]
        assert frames(view, tmp_path) == expected  # the bytes sent, every frame, in order: only timing differs
        if CASES[name]:
            assert len(done["files"]) > 1 and view not in done["files"]  # read through the merged view

        live, original = await questions(client, ref), await questions(client, str(sent))
    for protocol in CARRIES[name]:  # the answers compared hold the protocols: as many frames as tshark finds
        assert live[f"pcap_sequence_diagram {protocol}"]["frames_matched"] == tshark_count(sent, protocol) > 0
    if "ngap" in CARRIES[name]:
        assert live["ngap_ue_sessions contexts"]["ue_count"] > 0
    assert live.keys() == original.keys()
    compared = {key: compare(live[key], original[key], key) for key in live}
    total = sum(compared.values())
    print(f"{name}: {total} fields compared over {len(compared)} answers: {compared}")
    assert total >= 100 and all(compared.values()), compared
