"""The pcap back end through the real path (SDK client -> shim -> daemon -> sharkd), asserting facts
verified with tshark 4.0.17 on real public captures (shared/pcaps/MANIFEST.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import DIAGD, SUPPORT, DaemonProcess, Env, start_daemon
from tests.pcaps import PCAPS, pcap
from tests.support.progress import delivered

# An exact page whose rows came from the loaded worker; tshark may still win the race to find which frames
# match (both answers are exact; "tshark (single pass while sharkd loads)" is not one of them).
LOADED_WORKER = ("sharkd", "sharkd (frames found by tshark)")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]


def make_env(root: Path, config: str) -> Env:
    runtime = Path(f"/tmp/diagd-pcap-{os.getpid()}-{root.name[-10:]}")
    shutil.rmtree(runtime, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.toml").write_text(config)
    variables = {**os.environ, "DIAGD_RUNTIME_DIR": str(runtime), "DIAGD_STATE_DIR": str(root / "state"),
                 "DIAGD_CONFIG": str(root / "config.toml"), "PYTHONPATH": str(SUPPORT)}
    return Env(root, runtime, root / "state", root / "config.toml", variables)


@pytest.fixture(scope="module")
def pcap_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("pcapd")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{root}"]\n[pcap]\nmax_exports = 3\n')
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


@asynccontextmanager
async def client_for(daemon: DaemonProcess) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
    async with Client(params, mode="legacy") as client:
        yield client


async def call(daemon: DaemonProcess, tool: str, **args: Any) -> dict[str, Any]:
    async with client_for(daemon) as client:
        with trio.fail_after(60):
            result = await client.call_tool(tool, args)
    text = result.content[0].text
    payload: dict[str, Any] = json.loads(text)
    if not result.is_error:
        assert result.structured_content == payload
        assert set(result.meta or {}) >= {"duration_ms", "queue_ms", "bytes", "truncated"}
    payload["_is_error"] = result.is_error
    return payload


async def test_info_summarises_protocols_conversations_and_identity(pcap_daemon: DaemonProcess) -> None:
    with trio.fail_after(120):  # the protocols come with the first call, or a later one on a slow machine
        while not (info := await call(pcap_daemon, "pcap_info",
                                      pcap_path=pcap("adrian_registration_reject.pcap")))["protocols_ready"]:
            await trio.sleep(0.2)
    assert info["packet_count"] == 39
    assert info["sha256"].startswith("2530783fa528b48a")
    assert info["has_protocols"]["ngap"] and info["has_protocols"]["nas-5gs"] and not info["has_protocols"]["pfcp"]
    first = info["top_conversations"][0]
    assert first["proto"] == "SCTP" and first["b"].endswith(":38412")
    assert info["duration_s"] == pytest.approx(1.275003)
    assert "4.0" in info["tshark_version"] and info["source"]["pcap_path"].endswith("registration_reject.pcap")
    # The first answer may come from tshark beside the sharkd load; the warm worker must agree.
    await wait_loaded(pcap_daemon, pcap("adrian_registration_reject.pcap"))
    warm = await call(pcap_daemon, "pcap_info", pcap_path=pcap("adrian_registration_reject.pcap"),
                      include_command=True)
    assert warm["served_by"] == "sharkd"
    assert warm["packet_count"] == 39 and warm["has_protocols"] == info["has_protocols"]
    assert warm["top_conversations"][0]["frames"] == first["frames"]
    assert warm["source"]["equivalent_command"][:2] == ["tshark", "-r"]


async def test_registration_reject_cause_7_with_both_ue_ids(pcap_daemon: DaemonProcess) -> None:
    result = await call(pcap_daemon, "pcap_timeline", pcap_path=pcap("adrian_registration_reject.pcap"),
                        display_filter="nas_5gs.mm.message_type==0x44",
                        fields=["nas_5gs.mm.5gmm_cause", "ngap.RAN_UE_NGAP_ID", "ngap.aMF_UE_NGAP_ID"])
    assert result["rows"] == [{"frame.number": 19, "nas_5gs.mm.5gmm_cause": "7", "ngap.RAN_UE_NGAP_ID": "2",
                               "ngap.AMF_UE_NGAP_ID": "2"}]
    assert result["fields_resolved"]["ngap.aMF_UE_NGAP_ID"] == "ngap.AMF_UE_NGAP_ID"
    assert any("ngap.AMF_UE_NGAP_ID" in w for w in result["warnings"])


async def test_multi_pdu_frames_give_arrays_in_pdu_order(pcap_daemon: DaemonProcess) -> None:
    result = await call(pcap_daemon, "pcap_timeline", pcap_path=pcap("adrian_sandbox_n2.pcap"),
                        display_filter="frame.number==19", fields=["ngap.procedureCode"])
    assert result["rows"][0]["ngap.procedureCode"] == ["14", "46", "46"]
    initial = await call(pcap_daemon, "pcap_timeline", pcap_path=pcap("adrian_sandbox_n2.pcap"),
                         display_filter="ngap.procedureCode==15",
                         fields=["ngap.RAN_UE_NGAP_ID", "nas_5gs.mm.suci.msin", "e212.mcc", "e212.mnc"])
    assert [(r["frame.number"], r["ngap.RAN_UE_NGAP_ID"], r["nas_5gs.mm.suci.msin"]) for r in initial["rows"]] == [
        (9, "1", "0000000002"), (13, "2", "0000000003"), (23, "3", "0000000001")]


async def test_pdu_session_reject_needs_null_decipher_and_the_empty_result_says_why(
        pcap_daemon: DaemonProcess) -> None:
    path = pcap("adrian_pdu_session_reject_other.pcap")
    plain = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path,
                       display_filter="nas_5gs.sm.message_type==0xc3")
    assert plain["total"] == 0 and "null_decipher" in plain["hint"]
    lab = await call(pcap_daemon, "pcap_timeline", pcap_path=path, profile="5gc-lab",
                     display_filter="nas_5gs.sm.message_type==0xc3",
                     fields=["nas_5gs.sm.5gsm_cause", "ngap.RAN_UE_NGAP_ID"])
    assert lab["rows"] == [{"frame.number": 29, "nas_5gs.sm.5gsm_cause": "67", "ngap.RAN_UE_NGAP_ID": "2"}]
    assert lab["source"]["preferences"] == {"nas-5gs.null_decipher": "TRUE"}


async def test_a_filter_on_an_absent_protocol_says_it_is_absent(pcap_daemon: DaemonProcess) -> None:
    result = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=pcap("adrian_registration_reject.pcap"),
                        display_filter="pfcp")
    assert result["total"] == 0 and "not in this capture at all: pfcp" in result["hint"]


async def test_unanswered_pfcp_requests_in_the_upf_timeout(pcap_daemon: DaemonProcess) -> None:
    path = pcap("adrian_n4_upf_timeout_n4.pcap")
    unanswered = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path,
                            display_filter="pfcp.msg_type==50 && !pfcp.response_in")
    assert unanswered["total"] == 15
    responses = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="pfcp.msg_type==51")
    assert responses["total"] == 0
    answered = await call(pcap_daemon, "pcap_timeline", pcap_path=pcap("adrian_sandbox_n4.pcap"),
                          display_filter="pfcp.msg_type==50", fields=["pfcp.response_in"])
    assert [(r["frame.number"], r["pfcp.response_in"]) for r in answered["rows"]] == [(5, "6"), (9, "10"), (13, "14")]


async def test_ngap_ue_sessions_find_the_failing_ues_and_their_causes(pcap_daemon: DaemonProcess) -> None:
    reject = await call(pcap_daemon, "ngap_ue_sessions", pcap_path=pcap("adrian_registration_reject.pcap"))
    ue = next(u for u in reject["ues"] if u["ran_ue_ngap_id"] == 2)
    assert ue["amf_ue_ngap_id"] == 2 and ue["suci_msin"] == "0000000099" and ue["registration"] == "rejected"
    assert [(f["kind"], f["code"], f["frame"]) for f in ue["failures"]] == [("5GMM", 7, 19)]
    assert [(u["ran_ue_ngap_id"], [(r["code"], r["frame"], r["why"]) for r in u["reasons"]])
            for u in reject["failed_ues"]] == [(2, [(7, 19, "Registration reject")])]
    assert ue["procedures"][0]["procedure"] == "InitialUEMessage"
    slice_ = await call(pcap_daemon, "ngap_ue_sessions", pcap_path=pcap("adrian_pdu_session_reject_slice.pcap"))
    assert [(f["kind"], f["code"], f["frame"]) for u in slice_["ues"] for f in u["failures"]] == [("5GMM", 91, 37)]
    auth = await call(pcap_daemon, "ngap_ue_sessions", pcap_path=pcap("adrian_auth_failure.pcap"))
    assert [(f["code"], f["frame"]) for u in auth["ues"] for f in u["failures"]] == [(21, 11), (111, 12)]


async def test_pdu_session_summary_of_the_golden_run_and_the_upf_timeout(pcap_daemon: DaemonProcess) -> None:
    golden = await call(pcap_daemon, "ngap_pdu_session_summary", pcap_path=pcap("adrian_sandbox_n2.pcap"))
    assert [(s["ue_ipv4"], s["establishment_accept_frame"], s["setup_response_frame"], s["dnn"])
            for s in golden["sessions"]] == [("192.168.100.14", 22, 25, "internet"),
                                             ("192.168.100.15", 34, 35, "internet"),
                                             ("192.168.100.16", 41, 43, "internet")]
    first = golden["sessions"][0]
    assert first["n3_uplink"] == {"address": "10.53.0.13", "teid": "00:00:dc:50"}
    assert first["qfis"] == [1] and first["status"] == "established" and golden["rejected"] == []
    timeout = await call(pcap_daemon, "ngap_pdu_session_summary", pcap_path=pcap("adrian_n4_upf_timeout.pcap"))
    causes = [(f["code"], f["frame"]) for s in timeout["sessions"] for f in s["failures"]]
    assert [frame for _, frame in causes] == [20, 26, 31, 36, 38, 41, 47, 49, 52, 55]
    assert {code for code, _ in causes} == {38}


async def test_follow_http2_is_one_stream_of_one_connection(pcap_daemon: DaemonProcess) -> None:
    path = pcap("adrian_sandbox_sbi.pcap")
    result = await call(pcap_daemon, "pcap_follow", pcap_path=path, frame_number=604,
                        decode_as="tcp.port==7777,http2")
    assert result["follow_type"] == "http2.streamid"
    assert result["follow_key"] == {"tcp.stream": "14", "http2.streamid": "3"}
    assert [f["number"] for f in result["frames"]] == [604, 605, 677, 681]
    # Without the decode-as rule the frame is plain TCP: its TCP stream is followed, and the hint says why
    # no HTTP/2 shows (tests/e2e/test_pcap_follow.py compares TCP follows with tshark).
    undecoded = await call(pcap_daemon, "pcap_follow", pcap_path=path, frame_number=604)
    assert not undecoded["_is_error"] and undecoded["follow_key"] == {"tcp.stream": "14"}
    assert "decode_as=tcp.port==7777,http2" in undecoded["hint"]


async def test_follow_diameter_session_and_sip_call(pcap_daemon: DaemonProcess) -> None:
    diameter = await call(pcap_daemon, "pcap_follow", pcap_path=pcap("magma_gx_gy_combined_03.pcapng"),
                          frame_number=45)
    assert diameter["follow_key"] == {"diameter.Session-Id": "string;490;022;IMSI999991234567810"}
    assert diameter["total"] == 32
    assert diameter["frames"][0]["number"] == 45 and diameter["frames"][-1]["number"] == 273
    sip = await call(pcap_daemon, "pcap_follow", pcap_path=pcap("heplify_sip_ipv4_tcp.pcap"), frame_number=3)
    assert sip["follow_type"] == "sip.Call-ID"
    assert sip["follow_key"]["sip.Call-ID"] == "158936656982201062716@10.33.6.100"
    assert {3, 5, 7} <= {f["number"] for f in sip["frames"]}


async def test_bad_input_gets_the_right_codes(pcap_daemon: DaemonProcess) -> None:
    path = pcap("adrian_registration_reject.pcap")
    bad_filter = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="ngap &&& x")
    assert bad_filter["code"] == "INVALID_FILTER" and "unexpected" in bad_filter["message"]
    past_end = await call(pcap_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[40])
    assert past_end["code"] == "INVALID_ARGUMENT" and past_end["details"]["frame_count"] == 39
    bad_decode = await call(pcap_daemon, "pcap_info", pcap_path=path, decode_as="tcp.port==7777,nosuchproto")
    assert bad_decode["code"] == "INVALID_ARGUMENT" and "nosuchproto" in bad_decode["message"]
    unknown_field = await call(pcap_daemon, "pcap_timeline", pcap_path=path, fields=["ngap.RAN_UE_NGAP_IDD"])
    assert unknown_field["code"] == "INVALID_FIELDS"
    assert "ngap.RAN_UE_NGAP_ID" in unknown_field["details"]["did_you_mean"]["ngap.RAN_UE_NGAP_IDD"]
    missing = await call(pcap_daemon, "pcap_info", pcap_path=str(PCAPS / "nope.pcap"))
    assert missing["code"] == "FILE_NOT_FOUND"
    outside = await call(pcap_daemon, "pcap_info", pcap_path="/etc/hostname")
    assert outside["code"] == "PERMISSION_DENIED"
    not_capture = pcap_daemon.env.root / "not-a-capture.pcap"
    not_capture.write_bytes(bytes(range(256)) * 20)
    garbage = await call(pcap_daemon, "pcap_info", pcap_path=str(not_capture))
    assert garbage["code"] == "INVALID_ARGUMENT" and "isn't a capture file" in garbage["message"]


async def test_a_truncated_capture_loads_with_a_warning(pcap_daemon: DaemonProcess) -> None:
    # sharkd 4.0 never answers `load` for a file cut mid-packet: this must not hang.
    truncated = pcap_daemon.env.root / "truncated.pcap"
    truncated.write_bytes(Path(pcap("adrian_registration_reject.pcap")).read_bytes()[:3000])
    info = await call(pcap_daemon, "pcap_info", pcap_path=str(truncated))
    assert info["packet_count"] == 17
    assert "cut short" in info["warnings"][0]
    cold = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=str(truncated), display_filter="ngap")
    assert cold["total"] == 10  # whichever path answered: tshark beside the load, or the loaded sharkd
    await wait_loaded(pcap_daemon, str(truncated))
    warm = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=str(truncated), display_filter="ngap",
                      offset=1)
    # The loaded worker gives the rows; tshark may still win the race to find which frames match.
    assert warm["served_by"] in LOADED_WORKER
    assert warm["total"] == 10 and warm["frames"][0]["number"] == cold["frames"][1]["number"]


async def test_a_symlink_out_of_the_allowed_dirs_is_refused(pcap_daemon: DaemonProcess, tmp_path: Path) -> None:
    link = pcap_daemon.env.root / "escape.pcap"
    link.unlink(missing_ok=True)
    link.symlink_to("/etc/passwd")
    result = await call(pcap_daemon, "pcap_info", pcap_path=str(link))
    assert result["code"] == "PERMISSION_DENIED"


async def test_frame_detail_cuts_to_layers_adds_hex_and_caps_size(pcap_daemon: DaemonProcess) -> None:
    path = pcap("adrian_registration_reject.pcap")
    nas = await call(pcap_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[19], layers=["nas-5gs"])
    text = nas["frames"][0]["text"]
    assert "Registration reject (0x44)" in text and "5GS services not allowed (7)" in text
    assert "Ethernet II" not in text and "Stream Control Transmission Protocol" not in text
    full = await call(pcap_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[19], verbosity="full")
    assert "Ethernet II" in full["frames"][0]["text"] and "\n0000  " in full["frames"][0]["text"]
    capped = await call(pcap_daemon, "pcap_frame_detail", pcap_path=path, frame_numbers=[17, 19], max_bytes=1000)
    assert capped["truncated"] is True
    assert sum(len(f["text"].encode()) for f in capped["frames"]) <= 1000


async def test_text_search_finds_the_cause_in_the_decoded_text(pcap_daemon: DaemonProcess) -> None:
    result = await call(pcap_daemon, "pcap_text_search", pcap_path=pcap("adrian_registration_reject.pcap"),
                        query="services NOT allowed", layers=["nas-5gs"])
    assert result["frames_scanned"] == 39
    assert [(m["frame_number"], m["line"]) for m in result["matches"]] == [
        (19, "5GMM cause: 5GS services not allowed (7)")]


async def wait_loaded(daemon: DaemonProcess, path: str) -> None:
    with trio.fail_after(30):
        while not any(a["details"].get("path") == path and a["details"]["loads"]
                      for a in json.loads(daemon.env.run("status", "--json").stdout)["actors"]):
            await trio.sleep(0.1)


async def test_repeated_queries_are_served_from_the_cache(pcap_daemon: DaemonProcess) -> None:
    args = {"pcap_path": pcap("magma_gx_gy_combined_03.pcapng"), "display_filter": "diameter.cmd.code == 272"}
    first = await call(pcap_daemon, "pcap_frames_by_filter", **args)
    await wait_loaded(pcap_daemon, args["pcap_path"])
    warm = await call(pcap_daemon, "pcap_frames_by_filter", **args)
    again = await call(pcap_daemon, "pcap_frames_by_filter", **args)
    assert warm["served_by"] in LOADED_WORKER and again["cached"] is True
    assert warm["frames"] == again["frames"]
    # tshark beside the load agrees with sharkd, but for the columns a single pass's row marks provisional.
    assert len(first["frames"]) == len(warm["frames"])
    for early, exact in zip(first["frames"], warm["frames"], strict=True):
        marked = early.pop("provisional", [])
        assert {k: v for k, v in early.items() if k not in marked} == \
            {k: v for k, v in exact.items() if k not in marked}


async def test_packet_list_exports_have_unique_names_and_a_retention_limit(pcap_daemon: DaemonProcess) -> None:
    path = pcap("adrian_registration_reject.pcap")
    outputs = []
    for _ in range(4):
        result = await call(pcap_daemon, "pcap_packet_list", pcap_path=path, preview_rows=2,
                            extra_columns=[{"name": "cause", "field": "nas_5gs.mm.5gmm_cause"}])
        outputs.append(Path(result["output_path"]))
    assert len(set(outputs)) == 4
    assert result["rows_written"] == 39 and result["columns"][-1] == "cause"
    lines = outputs[-1].read_text().splitlines()
    assert lines[0].split("\t") == ["No.", "Time", "Source", "Destination", "Protocol", "Length", "Info", "cause"]
    assert "5GS services not allowed" in lines[19]
    remaining = list(outputs[-1].parent.iterdir())
    assert len(remaining) <= 3 and outputs[-1] in remaining and outputs[0] not in remaining


async def test_extract_subcapture_writes_a_readable_capture(pcap_daemon: DaemonProcess) -> None:
    result = await call(pcap_daemon, "pcap_extract_subcapture", pcap_path=pcap("adrian_sandbox_n2.pcap"),
                        frame_numbers=[9, 13, 23])
    assert result["packet_count"] == 3
    count = subprocess.run(["tshark", "-r", result["output_path"], "-Y", "ngap.procedureCode==15"],
                           capture_output=True, text=True, check=False).stdout.splitlines()
    assert len(count) == 3


async def test_field_discovery(pcap_daemon: DaemonProcess) -> None:
    found = await call(pcap_daemon, "pcap_list_fields", query="AMF_UE_NGAP_ID", include_protocols=["ngap"])
    assert any(f["name"] == "ngap.AMF_UE_NGAP_ID" for f in found["fields"])
    qfi = await call(pcap_daemon, "pcap_fields_search", prefix="pfcp.", keyword="qfi")
    assert any(f["name"] == "pfcp.qfi_value" for f in qfi["fields"])


async def test_config_get_lists_profiles_and_loaded_captures(pcap_daemon: DaemonProcess) -> None:
    await call(pcap_daemon, "pcap_info", pcap_path=pcap("adrian_sandbox_n4.pcap"))
    config = await call(pcap_daemon, "pcap_config_get")
    assert config["profiles"]["5gc-lab"]["preferences"] == {"nas-5gs.null_decipher": "TRUE"}
    assert any(c["details"]["path"].endswith("adrian_sandbox_n4.pcap") for c in config["loaded_captures"])
    assert all(c["details"]["sharkd_rss_bytes"] for c in config["loaded_captures"])
    # The generic worker list `diagd status` renders: the capture's sharkd, with its RSS.
    for c in config["loaded_captures"]:
        first = c["details"]["workers"][0]
        assert (first["pid"], first["role"]) == (c["details"]["sharkd_pid"], "sharkd")
        assert all(w["rss_bytes"] > 0 and w["role"] == "sharkd" for w in c["details"]["workers"])
        assert sum(w["rss_bytes"] for w in c["details"]["workers"]) == c["details"]["sharkd_rss_bytes"]
    status = await call(pcap_daemon, "diagd_status")
    assert status["daemon"]["workers"] >= len(config["loaded_captures"])
    assert status["daemon"]["workers_rss_bytes"] > 0 and status["daemon"]["rss_bytes"] > 0


async def test_loaded_captures_are_capped_lru_and_ids_can_be_masked(tmp_path: Path) -> None:
    env = make_env(tmp_path, f'[daemon]\nallowed_dirs = ["{PCAPS}"]\n[pcap]\nmax_loaded = 1\n'
                             "mask_subscriber_ids = true\n")
    daemon = start_daemon(env)
    try:
        await call(daemon, "pcap_info", pcap_path=pcap("adrian_sandbox_n4.pcap"))
        sessions = await call(daemon, "ngap_ue_sessions", pcap_path=pcap("adrian_registration_reject.pcap"))
        assert {u["suci_msin"] for u in sessions["ues"]} == {"**********"}
        followed = await call(daemon, "pcap_follow", pcap_path=pcap("magma_gx_gy_combined_03.pcapng"), frame_number=45)
        assert followed["follow_key"]["diameter.Session-Id"] == "string;490;022;IMSI99999" + "*" * 10
        status = json.loads(env.run("status", "--json").stdout)
        assert [a["details"]["path"] for a in status["actors"] if a["kind"] == "pcap"] == [
            pcap("magma_gx_gy_combined_03.pcapng")]
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


async def test_a_killed_sharkd_is_replaced_on_the_next_call(pcap_daemon: DaemonProcess) -> None:
    path = pcap("adrian_sandbox_n4.pcap")
    await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="pfcp", limit=1)
    status = json.loads(pcap_daemon.env.run("status", "--json").stdout)
    actor = next(a for a in status["actors"] if a["details"].get("path") == path)
    os.kill(actor["details"]["sharkd_pid"], 9)
    result = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="pfcp.msg_type==50")
    assert result.get("total") == 3, result  # the call that finds it dead starts a fresh one and answers
    again = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="pfcp.msg_type==51")
    assert again["total"] == 3


async def test_loading_a_capture_reports_progress(pcap_daemon: DaemonProcess) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with client_for(pcap_daemon) as client:
        with trio.fail_after(60):
            result = await client.call_tool("pcap_info", {"pcap_path": pcap("heplify_fax_call_t38_sip.pcap")},
                                            progress_callback=on_progress)
        await delivered()
    assert not result.is_error
    # In bytes of the file sharkd has read (its size from the file system, not from diagd), increasing;
    # "capture loaded" at all of it when the load ended within the call (else tshark answered first).
    size = os.stat(pcap("heplify_fax_call_t38_sip.pcap")).st_size
    assert seen[0][0] == 0 and "loading heplify_fax_call_t38_sip.pcap" in (seen[0][2] or "")
    assert {total for _, total, _ in seen} == {size}
    assert [done for done, _, _ in seen] == sorted({done for done, _, _ in seen})
    served_by = (result.structured_content or {}).get("served_by")
    if served_by == "sharkd" or seen[-1][0] == size:  # the load ended within the call
        assert seen[-1] == (size, size, "capture loaded")
    assert served_by == "sharkd" or served_by.startswith(("tshark", "capinfos")), served_by


async def test_big_pages_long_frame_lists_and_overlong_filters(pcap_daemon: DaemonProcess) -> None:
    # sharkd 4.0 reads requests into a 2 KiB buffer: nothing diagd sends may depend on page size.
    path = pcap("magma_gx_gy_combined_04.pcapng")
    first = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="diameter", limit=1000,
                       offset=200)
    # A new filter's first page may come before sharkd's pass: then its total is a lower bound.
    assert first["total_exact"] or first["total_at_least"] == 1201
    page = first
    with trio.fail_after(30):
        while not (page["total_exact"] and page["exact"]):
            await trio.sleep(0.1)
            page = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path, display_filter="diameter",
                              limit=1000, offset=200)
    assert page["total"] == 1288 and len(page["frames"]) == 1000 and page["has_more"] is True
    assert len(page["frames"]) == len(first["frames"])
    for early, exact in zip(first["frames"], page["frames"], strict=True):  # but for the columns marked provisional
        marked = early.pop("provisional", [])
        assert {k: v for k, v in early.items() if k not in marked} == \
            {k: v for k, v in exact.items() if k not in marked}
    extracted = await call(pcap_daemon, "pcap_extract_subcapture", pcap_path=path,
                           frame_numbers=list(range(1, 1501)))
    assert extracted["packet_count"] == 1500
    overlong = await call(pcap_daemon, "pcap_frames_by_filter", pcap_path=path,
                          display_filter=" || ".join(f"frame.number == {n}" for n in range(1, 400)))
    assert overlong["code"] == "INVALID_ARGUMENT" and "2 KiB" in overlong["message"]
    nothing = await call(pcap_daemon, "pcap_extract_subcapture", pcap_path=path, display_filter="pfcp")
    assert nothing["code"] == "NOT_FOUND"
