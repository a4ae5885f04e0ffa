"""Watchdog: a caller's catastrophic regex ends with a coded error while every other client is served.

Real daemon, real sharkd and Wireshark field catalogue, a stored crash output written by the store
itself. Assertions are by ordering and counts (how many answers another client got while one
pathological call ran), never by wall-clock bounds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from diagd.actors.crash.store import OutputStore
from tests.conftest import DIAGD, SUPPORT, DaemonProcess, Env, start_daemon
from tests.pcaps import PCAPS, pcap

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

# `regex` guards the classic nested-quantifier blow-ups (the issue's `(\w+\s?)+$` is linear for it),
# not overlapping alternatives that can never end in a match: exponential on any line of ~40 chars.
WORST = r"(.|..)+(?<!.)"
ISSUE_PATTERN = r"(\w+\s?)+$"
SESSION = "watchdog-000001"
BUDGET_S = 1.0
# One stored "crash log": lines long enough for WORST to blow up on each of them.
LOG = "\n".join(f"[{i:8.6f}] Stream Control Transmission Protocol association {i} lost its peer" for i in range(400))
BYSTANDER_ANSWERS = 3


def make_env(root: Path, config: str) -> Env:
    runtime = Path(f"/tmp/diagd-rx-{os.getpid()}-{root.name[-10:]}")
    shutil.rmtree(runtime, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.toml").write_text(config)
    variables = {**os.environ, "DIAGD_RUNTIME_DIR": str(runtime), "DIAGD_STATE_DIR": str(root / "state"),
                 "DIAGD_CONFIG": str(root / "config.toml"), "PYTHONPATH": str(SUPPORT)}
    return Env(root, runtime, root / "state", root / "config.toml", variables)


def config(root: Path, *, budget_s: float, call_timeout_s: float = 30.0) -> str:
    return (f'[daemon]\nallowed_dirs = ["{PCAPS}", "{root}"]\nextra_backends = ["echo_actor"]\n'
            f"regex_budget_s = {budget_s}\ncall_timeout_s = {call_timeout_s}\n")


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("regexd")
    env = make_env(root, config(root, budget_s=BUDGET_S))
    daemon = start_daemon(env)
    try:
        store = OutputStore(env.state / "crash")
        store.create_session(SESSION, {"vmcore": "/planted", "vmlinux": "/planted"})
        store.write(SESSION, 1, LOG + "\n", {"engine": "crash", "command": "log"})
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


@asynccontextmanager
async def client_for(daemon: DaemonProcess) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
    async with Client(params, mode="legacy") as client:
        yield client


async def call(client: Client, name: str, **args: Any) -> dict[str, Any]:
    with trio.fail_after(60):
        result = await client.call_tool(name, args)
    payload: dict[str, Any] = json.loads(result.content[0].text)
    payload["_is_error"] = result.is_error
    return payload


async def while_bystander_calls(attacker: Client, bystander: Client, tool: str, args: dict[str, Any]
                                ) -> tuple[dict[str, Any], int]:
    """Run one attacker call; meanwhile the bystander calls in a loop. Returns the attacker's answer
    and how many bystander answers arrived before it."""
    answers = 0
    outcome: list[dict[str, Any]] = []
    answered_before = -1

    async def attack() -> None:
        nonlocal answered_before
        outcome.append(await call(attacker, tool, **args))
        answered_before = answers

    async def bystand() -> None:
        nonlocal answers
        other = pcap("adrian_sandbox_n2.pcap")  # another capture: another actor than the attacker's
        while not outcome:
            for name, kwargs in (("diagd_status", {}), ("echo", {"message": f"still here {answers}"}),
                                 ("pcap_frames_by_filter", {"pcap_path": other, "limit": 3})):
                reply = await call(bystander, name, **kwargs)
                assert not reply["_is_error"], reply
                answers += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(bystand)
        await attack()
    return outcome[0], answered_before


async def test_catastrophic_patterns_end_in_timeout_while_another_client_keeps_being_served(
        watched: DaemonProcess) -> None:
    capture = pcap("adrian_registration_reject.pcap")
    async with client_for(watched) as attacker, client_for(watched) as bystander:
        # Warm: the capture loaded, the field catalogue read, the bystander's capture loaded.
        await call(attacker, "pcap_text_search", pcap_path=capture, query="services NOT allowed")
        await call(attacker, "pcap_list_fields", query="AMF_UE_NGAP_ID")
        await call(bystander, "pcap_frames_by_filter", pcap_path=pcap("adrian_sandbox_n2.pcap"), limit=3)
        attacks = [
            ("pcap_text_search", {"pcap_path": capture, "query": WORST, "is_regex": True}, "frame"),
            ("pcap_list_fields", {"query": WORST, "is_regex": True}, "field"),
            ("search_command_output", {"command_id": f"{SESSION}:1", "query": WORST}, "line"),
        ]
        for tool, args, unit in attacks:
            answer, bystander_answers = await while_bystander_calls(attacker, bystander, tool, args)
            assert answer["_is_error"] and answer["code"] == "TIMEOUT", (tool, answer)
            assert WORST in answer["message"] and f"{BUDGET_S:g} s matching budget at {unit} " in answer["message"]
            assert answer["details"]["pattern"] == WORST and unit in answer["details"]["stopped_at"]
            assert bystander_answers >= BYSTANDER_ANSWERS, (tool, bystander_answers)
        # The pcap actor that ran the search survived it: an ordinary regex on it still answers.
        again = await call(attacker, "pcap_text_search", pcap_path=capture, query=r"services not allow\w+",
                           is_regex=True, layers=["nas-5gs"])
        assert not again["_is_error"] and [m["frame_number"] for m in again["matches"]] == [19]


async def test_the_issue_pattern_answers_and_bad_patterns_are_invalid_argument(watched: DaemonProcess) -> None:
    capture = pcap("adrian_registration_reject.pcap")
    async with client_for(watched) as client:
        stored = await call(client, "search_command_output", command_id=f"{SESSION}:1", query=ISSUE_PATTERN)
        assert not stored["_is_error"] and stored["match_count"] == stored["total_lines"] == 400
        frames = await call(client, "pcap_text_search", pcap_path=capture, query=ISSUE_PATTERN, is_regex=True,
                            max_matches=5)
        assert not frames["_is_error"] and frames["match_count"] == 5
        for tool, args in (("pcap_text_search", {"pcap_path": capture, "is_regex": True}),
                           ("pcap_list_fields", {"is_regex": True}),
                           ("search_command_output", {"command_id": f"{SESSION}:1"})):
            bad = await call(client, tool, query="ngap(\\w+", **args)
            assert bad["code"] == "INVALID_ARGUMENT", (tool, bad)
            assert bad["message"] == "query is not a valid regular expression: missing ), unterminated subpattern " \
                                     "at position 4"
            huge = await call(client, tool, query="a{4294967294}", **args)
            assert huge["code"] == "INVALID_ARGUMENT" and "counted repeats" in huge["message"], (tool, huge)


async def wait_running(daemon: DaemonProcess, client: Client, tool: str) -> None:
    """Until diagd_calls lists `tool` as still running (the audit 'started' record)."""
    with trio.fail_after(30):
        while True:
            calls = await call(client, "diagd_calls", tool=tool, limit=5)
            if any(c["outcome"] == "running" for c in calls["calls"]):
                return
            await trio.sleep(0.05)


@pytest.mark.parametrize("tool", ["pcap_list_fields", "pcap_text_search"])
async def test_sigterm_during_a_pathological_search_stops_the_daemon(tmp_path: Path, tool: str) -> None:
    # A budget far beyond the test: the daemon must stop long before the engine would give up.
    env = make_env(tmp_path, config(tmp_path, budget_s=3600, call_timeout_s=7200))
    daemon = start_daemon(env)
    try:
        capture = pcap("adrian_registration_reject.pcap")
        args: dict[str, Any] = {"query": WORST, "is_regex": True}
        if tool == "pcap_text_search":
            args["pcap_path"] = capture
        async with client_for(daemon) as watcher, client_for(daemon) as attacker:
            await call(attacker, "pcap_list_fields", query="AMF_UE_NGAP_ID")  # the catalogue is read
            await call(attacker, "pcap_text_search", pcap_path=capture, query="x")  # the capture is loaded
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_call_ignoring_hangup, attacker, tool, args)
                await wait_running(daemon, watcher, tool)
                await call(watcher, "diagd_status")  # the loop still answers mid-search
                daemon.proc.send_signal(signal.SIGTERM)
                rc = await trio.to_thread.run_sync(daemon.proc.wait, 60)
                nursery.cancel_scope.cancel()
        assert rc == 0, daemon.log()[-2000:]
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon ignored SIGTERM during a pathological search")
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
        daemon.proc.wait(10)
        shutil.rmtree(env.runtime, ignore_errors=True)


async def _call_ignoring_hangup(client: Client, tool: str, args: dict[str, Any]) -> None:
    try:
        await client.call_tool(tool, args)
    except Exception:  # the daemon went away mid-call: what this test wants
        pass
