"""pcap answers that used to mislead: layers that silently gave empty text, a text search that
stopped after 200 frames and said "0 matches", files that are no capture crashing the actor,
and diagd's own exports it could not read back."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import call, client_for, make_env
from tests.pcaps import PCAPS, pcap
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]


@pytest.fixture(scope="module")
def answers_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("pcapans")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{root}"]\n')
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# 3. layers: either spelling, and an unknown or absent layer is an error naming what is there


async def test_a_layer_named_by_its_field_prefix_gives_the_same_text(answers_daemon: DaemonProcess) -> None:
    path = pcap("adrian_registration_reject.pcap")
    by_filter = await call(answers_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[19], layers=["nas-5gs"])
    by_prefix = await call(answers_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[19], layers=["nas_5gs"])
    upper = await call(answers_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[19], layers=["NAS-5GS"])
    text = by_filter["frames"][0]["text"]
    assert "5GS services not allowed (7)" in text and "Ethernet II" not in text
    assert by_prefix["frames"][0]["text"] == upper["frames"][0]["text"] == text
    assert by_prefix["layers_resolved"] == {"nas_5gs": "nas-5gs"}
    searched = await call(answers_daemon, "pcap_text_search", pcap_path=path, query="services not allowed",
                          layers=["nas_5gs"])
    assert [(m["frame_number"], m["line"]) for m in searched["matches"]] == [
        (19, "5GMM cause: 5GS services not allowed (7)")]


async def test_an_unknown_or_absent_layer_names_the_layers_there(answers_daemon: DaemonProcess) -> None:
    path = pcap("adrian_registration_reject.pcap")
    typo = await call(answers_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[19], layers=["nas5gs"])
    assert typo["_is_error"] and typo["code"] == "INVALID_ARGUMENT"
    assert typo["details"]["layers_present"] == ["frame", "eth", "ip", "sctp", "ngap", "nas-5gs"]
    assert "nas-5gs" in typo["details"]["did_you_mean"]["nas5gs"]
    assert "frame 19" in typo["message"] and "nas-5gs" in typo["message"]
    absent = await call(answers_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[1], layers=["ngap"])
    assert absent["code"] == "INVALID_ARGUMENT" and absent["details"]["layers_present"] == ["frame", "eth", "ip",
                                                                                            "sctp"]
    # Several frames: an error only when no frame has the layer; else each frame says what it lacks.
    mixed = await call(answers_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[1, 19], layers=["nas-5gs"])
    first, second = mixed["frames"]
    assert first["text"] == "" and first["layers_missing"] == ["nas-5gs"] and "sctp" in first["layers_present"]
    assert "Registration reject" in second["text"] and "layers_missing" not in second
    searched = await call(answers_daemon, "pcap_text_search", pcap_path=path, query="x", layers=["pfcp", "ngapp"])
    assert searched["code"] == "INVALID_ARGUMENT" and "this capture" in searched["message"]
    assert searched["details"]["did_you_mean"]["ngapp"] == ["ngap"]
    assert "nas-5gs" in searched["details"]["layers_present"]


# ---------------------------------------------------------------------------------------------
# 4. text search: every frame of the filter, not the first 200


def tshark_lines(path: str, query: str) -> list[tuple[int, str]]:
    """(frame, line) for every line of `tshark -V` holding `query` (case-insensitive)."""
    argv = ["tshark", "-r", path, "-n", "-2", "-V"]

    def run() -> str:  # tshark's text, kept on disk (tests/support/pcap_oracle.cached_text)
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    text = oracle.cached_text(Path(path), [*argv, oracle.config_key()], run)
    found, frame = [], 0
    for line in text.split("\n"):
        if line.startswith("Frame ") and line.split(" ")[1].rstrip(":").isdigit():
            frame = int(line.split(" ")[1].rstrip(":"))
        if query.lower() in line.lower():
            found.append((frame, line.strip()))
    return found


async def test_text_search_covers_every_frame_past_the_old_200_frame_page(answers_daemon: DaemonProcess) -> None:
    path = pcap("5greplay_oai.pcap")
    result = await call(answers_daemon, "pcap_text_search", pcap_path=path, query="Echo (ping) request",
                        max_matches=1000)
    expected = tshark_lines(path, "Echo (ping) request")
    assert expected and expected[0][0] > 200  # the first ping is past the old default page
    assert result["complete"] is True and result["stopped_because"] is None
    assert result["frames_scanned"] == result["frames_total"] == 753
    assert [(m["frame_number"], m["line"]) for m in result["matches"]] == expected
    page = await call(answers_daemon, "pcap_text_search", pcap_path=path, query="Echo (ping) request", limit=200)
    assert page["complete"] is False and page["stopped_because"] == "limit" and page["match_count"] == 0
    assert page["note"].startswith("INCOMPLETE: searched 200 of the 753 frames") and page["next_offset"] == 200


# ---------------------------------------------------------------------------------------------
# 5. a file that is no capture: INVALID_ARGUMENT on every pcap tool, no actor started or crashed

REQUIRED = {"pcap_timeline": {"fields": ["ip.src"]}, "pcap_frame_detail": {"frame_numbers": [1]},
            "pcap_text_search": {"query": "x"}, "pcap_follow": {"frame_number": 1},
            "pcap_extract_subcapture": {"display_filter": "ip"}, "pcap_stats": {"kind": "expert"},
            "pcap_sequence_diagram": {"display_filter": "ip"}}


def not_captures(root: Path) -> dict[str, Path]:
    files = {"text": b"hello\nthis is text, not packets\n", "json": b'{"a": [1, 2, 3]}\n', "empty": b"",
             "png": bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108000000003a7e9b55"
                                  "0000000a49444154789c63600000000200015e2b4e3a0000000049454e44ae426082"),
             "random": bytes(range(256)) * 20}
    paths = {}
    for name, data in files.items():
        paths[name] = root / f"{name}.pcap"
        paths[name].write_bytes(data)
    return paths


async def test_files_that_are_no_capture_get_invalid_argument_on_every_pcap_tool(
        answers_daemon: DaemonProcess) -> None:
    files = not_captures(answers_daemon.env.root)
    async with client_for(answers_daemon) as client:
        tools = [t for t in (await client.list_tools()).tools if "pcap_path" in t.input_schema.get("properties", {})]
        assert len(tools) >= 10
        for name, path in files.items():
            for tool in tools:
                got = await call_on(client, tool.name, {"pcap_path": str(path), **REQUIRED.get(tool.name, {})})
                assert got["_is_error"] and got["code"] == "INVALID_ARGUMENT", (name, tool.name, got)
                assert got["message"].startswith("not a capture file: "), (name, tool.name, got)
    status = json.loads(answers_daemon.env.run("status", "--json").stdout)
    refused = {str(path) for path in files.values()}
    assert not [a for a in status["actors"] if a["kind"] == "pcap" and a["details"].get("path") in refused]
    assert "crashed" not in answers_daemon.log()
    fine = await call(answers_daemon, "pcap_info", pcap_path=pcap("adrian_sandbox_n4.pcap"))
    assert fine["packet_count"] == 16


async def call_on(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    with trio.fail_after(60):
        result = await client.call_tool(tool, args)
    payload: dict[str, Any] = json.loads(result.content[0].text)
    payload["_is_error"] = result.is_error
    return payload


# ---------------------------------------------------------------------------------------------
# 6. what diagd wrote can be analysed without touching allowed_dirs


async def test_exports_are_readable_without_adding_the_output_dir(tmp_path: Path) -> None:
    env = make_env(tmp_path, f'[daemon]\nallowed_dirs = ["{PCAPS}"]\n')  # output_dir: the state dir, not listed
    daemon = start_daemon(env)
    try:
        path = pcap("adrian_sandbox_n2.pcap")
        sub = await call(daemon, "pcap_extract_subcapture", pcap_path=path, frame_numbers=[9, 13, 23])
        assert Path(sub["output_path"]).parent == env.state / "pcap" / "exports"
        with trio.fail_after(120):  # the protocols come with the first call, or a later one on a slow machine
            while not (info := await call(daemon, "pcap_info", pcap_path=sub["output_path"]))["protocols_ready"]:
                await trio.sleep(0.2)
        assert info["packet_count"] == 3 and info["has_protocols"]["ngap"]
        rows = await call(daemon, "pcap_timeline", pcap_path=sub["output_path"], fields=["ngap.RAN_UE_NGAP_ID"])
        assert [r["ngap.RAN_UE_NGAP_ID"] for r in rows["rows"]] == ["1", "2", "3"]
        listed = await call(daemon, "pcap_packet_list", pcap_path=path, preview_rows=0)
        tsv = await call(daemon, "pcap_info", pcap_path=listed["output_path"])
        assert tsv["code"] == "INVALID_ARGUMENT" and tsv["message"].startswith("not a capture file")
        # Only the export directory is added, not the rest of diagd's state.
        elsewhere = env.state / "copy.pcap"
        shutil.copy(path, elsewhere)
        assert (await call(daemon, "pcap_info", pcap_path=str(elsewhere)))["code"] == "PERMISSION_DENIED"
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)
