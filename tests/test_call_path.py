"""One tool call, followed from the socket to the back end and back, enters each diagd module once.

A real daemon (tests/support/calltrace/sitecustomize.py on its PYTHONPATH) records, for one warm call
(capture loaded, catalogue cached, frames not in the actor's answer cache so sharkd answers), every
fresh call into a `diagd.*` module from another module, as the chain of diagd modules on the stack.
The chains of tasks the call hands work to (the actor's) are joined at the hand-off. Two rules:
- no module appears twice in a chain: the path never comes back to a module through a call;
- in the call's chains each module is entered from one module only (not from two levels),
except the leaf utilities listed below, which must call no diagd module themselves.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import SUPPORT, DaemonProcess, start_daemon, wait_for_path
from tests.e2e.test_pcap import client_for, make_env
from tests.pcaps import PCAPS, pcap

pytestmark = [pytest.mark.e2e]
TRACER = SUPPORT / "calltrace"


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "masked"])
def traced_daemon(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("traced")
    mask = "true" if request.param else "false"
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{root}"]\nextra_backends = ["echo_actor"]\n'
                          f'[pcap]\nmask_subscriber_ids = {mask}\n')
    env.vars["PYTHONPATH"] = f"{TRACER}{os.pathsep}{env.vars['PYTHONPATH']}"
    env.vars["DIAGD_CALL_TRACE"] = str(root / "trace.jsonl")
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


async def traced_call(daemon: DaemonProcess, tool: str, warm_args: dict[str, Any],
                      args: dict[str, Any]) -> list[dict[str, Any]]:
    trace = Path(daemon.env.vars["DIAGD_CALL_TRACE"])
    async with client_for(daemon) as client:
        with trio.fail_after(60):
            warm = await client.call_tool(tool, warm_args)  # warm-up: capture loaded, catalogue cached
            assert not warm.is_error, warm.content
            for stale in (trace, Path(f"{trace}.on")):
                stale.unlink(missing_ok=True)
            daemon.proc.send_signal(signal.SIGUSR1)
            await trio.to_thread.run_sync(wait_for_path, Path(f"{trace}.on"), daemon.proc)
            result = await client.call_tool(tool, args)
            daemon.proc.send_signal(signal.SIGUSR2)
            await trio.to_thread.run_sync(wait_for_path, trace, daemon.proc)
    assert not result.is_error, result.content
    return [json.loads(line) for line in trace.read_text().splitlines()]


# Modules a call may enter from several places: leaf values and helpers that call no other diagd
# module (checked below), so entering them again never means the call path turned back.
LEAF_UTILITIES = {
    "diagd.protocol.errors",  # DiagdError: raised wherever a call is refused
    "diagd.actors.tooling",  # CallContext (a value) and small helpers (caller_cwd, schema defaults)
    "diagd.actors.pcap.messages",  # frozen messages: built by the tools, hashed and matched by the actor
    "diagd.actors.pcap.engine.capture",  # CaptureSpec: built by the back end, its key read where actors are found
    "diagd.actors.pcap.shark.rows",  # pure row shaping: the tools build the equivalent tshark argv, the actor the rows
    # Child-process lifecycle (open, drain, reap, stop): used by each owner of a process the call reaches,
    # the capture's sharkd workers and the warm tshark that found the page's frames (standby.py); on a
    # call's success path it calls no diagd module (its errors are built only when a child fails).
    "diagd.actors._subprocess",
}
# Re-entries allowed for now: none (a re-entry added here must say why; the test fails on any other).
KNOWN: set[str] = set()


def joined_chains(records: list[dict[str, Any]]) -> tuple[list[list[str]], list[list[str]]]:
    """(chains of the call: its own task's, and those of tasks it handed work to joined at the hand-off,
    other tasks' chains as they are)."""
    call_task = next(r["task"] for r in records if "diagd.daemon.server.tools" in r["chain"])
    call: list[list[str]] = []
    other: list[list[str]] = []
    handoff: dict[str, list[str] | None] = {}
    last_call_chain: list[str] | None = None
    for r in records:
        chain = r["chain"]
        if r["task"] == call_task:
            last_call_chain = chain
            call.append(chain)
            continue
        if r["task"] not in handoff:  # this task woke while the call waited at the end of its chain
            handoff[r["task"]] = last_call_chain
        base = handoff[r["task"]]
        if base is not None and base[-1] in chain:
            call.append(base + chain[chain.index(base[-1]) + 1:])
        else:
            other.append(chain)
    return call, other


def violations(records: list[dict[str, Any]]) -> set[str]:
    call, other = joined_chains(records)
    found: set[str] = set()
    for chain in call + other:
        for i, module in enumerate(chain):
            if module in LEAF_UTILITIES:
                assert i == len(chain) - 1, f"{module} is listed as a leaf utility but calls {chain[i + 1]}"
            elif module in chain[:i]:  # left for another module, then called again
                found.add(f"{module} re-entered via {chain[i - 1]}")
    parents: dict[str, set[str]] = {}
    for chain in call:
        for parent, module in itertools.pairwise(chain):
            parents.setdefault(module, set()).add(parent)
    for module, via in parents.items():
        if len(via) > 1 and module not in LEAF_UTILITIES:
            found.add(f"{module} entered from {' and '.join(sorted(via))}")
    return found


def describe(records: list[dict[str, Any]]) -> str:
    return "\n".join(f"{r['task'][-5:]} {' > '.join(r['chain'])} :: {r['function']}" for r in records)


async def test_frame_detail_enters_each_module_once(traced_daemon: DaemonProcess) -> None:
    path = pcap("adrian_registration_reject.pcap")
    # Warm-up on frame 1, then frame 2: not in the actor's answer cache, so the call reaches sharkd.
    records = await traced_call(traced_daemon, "pcap_frame_detail", {"pcap_path": path, "frame_numbers": [1]},
                                {"pcap_path": path, "frame_numbers": [2]})
    functions = {r["function"] for r in records}
    assert {"ToolRegistry.call", "frame_detail", "PcapActor.handle"} <= functions, describe(records)
    assert functions & {"Sharkd.call", "Sharkd.call_many"}, describe(records)  # trees come pipelined
    assert violations(records) - KNOWN == set(), describe(records)


async def test_frames_by_filter_enters_each_module_once(traced_daemon: DaemonProcess) -> None:
    path = pcap("adrian_registration_reject.pcap")
    records = await traced_call(traced_daemon, "pcap_frames_by_filter", {"pcap_path": path, "display_filter": "ngap"},
                                {"pcap_path": path, "display_filter": "nas-5gs"})
    functions = {r["function"] for r in records}
    assert {"ToolRegistry.call", "frames_by_filter", "PcapActor.handle"} <= functions, describe(records)
    # The page's rows come from sharkd: its pass's page (Sharkd.call), or the `frame` requests of the rows
    # a (warm) tshark found first (Sharkd.call_many).
    assert functions & {"Sharkd.call", "Sharkd.call_many"}, describe(records)
    assert violations(records) - KNOWN == set(), describe(records)


async def test_echo_enters_each_module_once(traced_daemon: DaemonProcess) -> None:
    # The smallest back end (tests/support/echo_actor.py, not a diagd module: its own frames are not
    # counted) on the same path: registry, runtime, supervisor, actor base and back.
    records = await traced_call(traced_daemon, "echo", {"message": "warm"}, {"message": "hello"})
    functions = {r["function"] for r in records}
    assert {"ToolRegistry.call", "Supervisor.ask"} <= functions, describe(records)
    assert violations(records) - KNOWN == set(), describe(records)
