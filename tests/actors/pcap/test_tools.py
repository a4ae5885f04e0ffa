"""The pcap tools against a fake runtime: what message each tool sends its capture's actor, that a
file which is no capture is refused before any actor starts, and that masking is at the tool boundary.

The actor is replaced (`RecordingRuntime` answers every ask with a canned reply), so these need
tshark and capinfos (spec checks, identity collection) but no sharkd.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from diagd.actors import pcap
from diagd.actors.base import ProgressFn
from diagd.actors.pcap.messages import Check, Detail, Export, Frames, NgapSessions, TextSearch, Timeline
from diagd.actors.runtime import ActorFactory, ActorRef, IdleTimeout
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.pcaps import pcap as shared_pcap
from tests.support.fake_runtime import FakeRuntime, fake_runtime

CAPTURE = "adrian_auth_failure.pcap"


class _Ref:
    def __init__(self, kind: str, resource: str) -> None:
        self.id, self.kind, self.resource = f"{kind}-1", kind, resource
        self.actor = None
        self.accepting = True

    def statistics(self) -> dict[str, Any]:
        return {"resource": self.resource}


class Recorder:
    """Stands in for the supervisor: records starts and messages, answers with `reply`."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self.started: list[str] = []
        self.messages: list[object] = []
        self.reply: dict[str, Any] = {}

        async def start(kind: str, resource: str, factory: ActorFactory, *,
                        idle_timeout_s: IdleTimeout = None) -> ActorRef:
            self.started.append(resource)
            return _Ref(kind, resource)

        async def ask(ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> dict[str, Any]:
            self.messages.append(message)
            return dict(self.reply)

        runtime.start = start  # type: ignore[method-assign]
        runtime.ask = ask  # type: ignore[method-assign]
        runtime.find = lambda kind, resource: None  # type: ignore[method-assign]


@asynccontextmanager
async def pcap_tools(tmp_path: Path, **table: Any) -> AsyncIterator[tuple[FakeRuntime, Recorder]]:
    async with fake_runtime(tmp_path, "pcap", table) as runtime:
        recorder = Recorder(runtime)
        pcap.register(runtime)
        yield runtime, recorder


async def test_tools_send_messages_with_the_schema_defaults_filled_in(tmp_path: Path) -> None:
    path = shared_pcap(CAPTURE)
    async with pcap_tools(tmp_path) as (rt, rec):
        rec.reply = {"total": 0, "frames": [], "has_more": False, "served_by": "sharkd", "cached": False}
        answer = await rt.call("pcap_frames_by_filter", {"pcap_path": path, "display_filter": "ngap"})
        assert rec.messages[-1] == Frames(display_filter="ngap", limit=500, offset=0,
                                          kinds=(("ngap", "FT_PROTOCOL", "ngap"),))
        assert answer["limit"] == 500 and answer["source"]["pcap_path"] == path
        assert "equivalent_command" not in answer["source"]

        rec.reply = {"total": 0, "rows": [], "has_more": False}
        await rt.call("pcap_timeline", {"pcap_path": path, "fields": ["frame.number", "NGAP.procedureCode"]})
        assert rec.messages[-1] == Timeline(display_filter="ngap.procedureCode",
                                            fields=("frame.number", "ngap.procedureCode"), limit=200, offset=0,
                                            sort_by=None, kinds=(("ngap.procedureCode", "FT_UINT32", "ngap"),
                                                                 ("frame.number", "FT_UINT32", "frame")))

        rec.reply = {"frames": [], "truncated": False, "layers_resolved": None}
        await rt.call("pcap_frame_detail", {"pcap_path": path, "frame_numbers": [3, 1]})
        assert rec.messages[-1] == Detail(frame_numbers=(3, 1), layers=(), restrict_layers=True,
                                          verbosity="summary", max_bytes=200000)

        rec.reply = {"frames_total": 0, "frames_scanned": 0, "complete": True, "matches": []}
        await rt.call("pcap_text_search", {"pcap_path": path, "query": "Registration"})
        sent = rec.messages[-1]
        assert isinstance(sent, TextSearch) and sent.query == "Registration" and sent.limit is None
        assert (sent.max_matches, sent.snippet_context_chars, sent.offset) == (50, 240, 0)
        assert sent.stop_at is not None  # the call has a deadline: the scan stops inside it

        rec.reply = {"ue_count": 0, "ues": []}
        await rt.call("ngap_ue_sessions", {"pcap_path": path})
        assert rec.messages[-1] == NgapSessions(display_filter="")


async def test_the_export_is_asked_of_the_actor_after_its_filter_is_checked(tmp_path: Path) -> None:
    path = shared_pcap(CAPTURE)
    async with pcap_tools(tmp_path) as (rt, rec):
        rec.reply = {"output_path": "/x.pcapng", "packet_count": 1, "file_size_bytes": 10,
                     "display_filter": "(frame.number in {2}) && (ngap)"}
        answer = await rt.call("pcap_extract_subcapture", {"pcap_path": path, "display_filter": "ngap",
                                                           "frame_numbers": [2], "include_command": True})
        check, export = rec.messages
        assert check == Check("ngap")
        assert isinstance(export, Export) and export.display_filter == "(frame.number in {2}) && (ngap)"
        assert Path(export.output_path).parent == tmp_path / "pcap" / "exports"
        assert answer["source"]["equivalent_command"][-6:] == ["-Y", export.display_filter, "-w",
                                                               export.output_path, "-F", "pcapng"]


async def test_a_file_that_is_no_capture_is_refused_before_any_actor_starts(tmp_path: Path) -> None:
    notes = tmp_path / "notes.pcap"
    notes.write_text("not a capture\n" * 10)
    async with pcap_tools(tmp_path) as (rt, rec):
        for tool, args in (("pcap_info", {}), ("pcap_frames_by_filter", {}), ("ngap_ue_sessions", {}),
                           ("pcap_frame_detail", {"frame_numbers": [1]})):
            with pytest.raises(DiagdError) as info:
                await rt.call(tool, {"pcap_path": str(notes), **args})
            assert info.value.code == ErrorCode.INVALID_ARGUMENT, tool
        assert rec.started == [] and rec.messages == []


IMSI = "001010000000001"


@pytest.mark.parametrize("masked", [True, False])
async def test_what_the_actor_answers_is_masked_at_the_tool_boundary(tmp_path: Path, masked: bool) -> None:
    path = shared_pcap(CAPTURE)
    async with pcap_tools(tmp_path, mask_subscriber_ids=masked) as (rt, rec):
        rec.reply = {"total": 1, "frames": [{"number": 1, "info": f"GET /nudm-sdm/v2/imsi-{IMSI}/am-data"}],
                     "has_more": False}
        answer = await rt.call("pcap_frames_by_filter", {"pcap_path": path})
        info = answer["frames"][0]["info"]
        if masked:
            assert IMSI not in info and f"imsi-{IMSI[:5]}{'*' * 10}/" in info
        else:
            assert f"imsi-{IMSI}/" in info
        # The actor got the real filter either way: masking is for what leaves a tool, not what enters.
        assert rec.messages[-1] == Frames(display_filter="", limit=500, offset=0, kinds=())
