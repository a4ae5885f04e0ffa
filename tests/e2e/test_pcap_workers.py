"""No queueing behind one worker (issue 12): a capture whose calls queue gets a second sharkd worker,
a frame tree is served by the free worker while the other runs a filter pass, and the memory budget
(`[pcap] max_memory_mb`) bounds both the second worker and the captures kept loaded (least recently
used evicted). Order of completion is asserted, never wall-clock bounds (bench/pcap.py measures)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import Call, session
from tests.pcaps import PCAPS

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

def framenum_filter(n: int) -> str:
    """A new filter that only sharkd answers (it names a link to later frames: never raced)."""
    return f"diameter.answer_in > {n} || frame.len == {n}"


def daemon_with(tmp_path_factory: pytest.TempPathFactory, name: str, pcap_table: str) -> DaemonProcess:
    root = tmp_path_factory.mktemp(name)
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "/tmp"]\ncall_timeout_s = 120\n'
                         f"[pcap]\n{pcap_table}\n")
    return start_daemon(env)


@pytest.fixture(scope="module")
def pool_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    daemon = daemon_with(tmp_path_factory, "pool", "workers_per_capture = 2")
    yield daemon
    daemon.stop()
    shutil.rmtree(daemon.env.runtime, ignore_errors=True)


async def new_filter(call: Call, path: Path, n: int) -> None:
    page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter=framenum_filter(n))
    assert not page["_is_error"], page


async def capture_details(call: Call, path: Path) -> dict[str, Any]:
    config = await call("pcap_config_get")
    found = [c["details"] for c in config["loaded_captures"] if c["details"]["path"] == str(path)]
    assert found, config["loaded_captures"]
    return found[0]


async def two_idle_workers(call: Call, path: Path, first: int) -> list[dict[str, Any]]:
    """The capture loaded, with a second worker (grown for two filter passes at once), both idle."""
    # Loaded first (a frame tree needs the worker; pcap_info answers while it loads).
    assert not (await call("pcap_frame_detail", pcap_path=str(path), frame_numbers=[1]))["_is_error"]
    async with trio.open_nursery() as nursery:  # two passes at once: the second call would queue
        for n in (first, first + 1):
            nursery.start_soon(new_filter, call, path, n)
    with trio.fail_after(60):
        while True:
            workers: list[dict[str, Any]] = (await capture_details(call, path))["workers"]
            if len(workers) == 2 and all(w["state"] == "idle" for w in workers):
                return workers
            await trio.sleep(0.1)


async def test_a_busy_capture_gets_a_second_worker_and_trees_pass_a_filter_pass(
        pool_daemon: DaemonProcess, bigger: Path) -> None:
    async with session(pool_daemon) as call:
        workers = await two_idle_workers(call, bigger, 1)
        assert all(w["pid"] and w["rss_bytes"] for w in workers)

        finished: list[str] = []

        async def filter_pass() -> None:
            page = await call("pcap_frames_by_filter", pcap_path=str(bigger), display_filter=framenum_filter(3))
            assert not page["_is_error"] and page["total_exact"]
            finished.append("filter")

        async def frame_tree() -> None:
            with trio.fail_after(30):
                while not any(w["doing"] == "filter pass" for w in (await capture_details(call, bigger))["workers"]):
                    await trio.sleep(0.01)
            detail = await call("pcap_frame_detail", pcap_path=str(bigger), frame_numbers=[4321])
            assert not detail["_is_error"], detail
            finished.append("tree")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(filter_pass)
            nursery.start_soon(frame_tree)
        assert finished == ["tree", "filter"]



async def test_pcap_info_reads_the_capture_on_both_free_workers_and_equals_the_tools(
        pool_daemon: DaemonProcess, bigger: Path) -> None:
    """A loaded capture's first pcap_info: sharkd's `analyse` and the conversation taps run on the two
    free workers side by side, and the answer is tshark's and capinfos' (test_pcap_oracle's check)."""
    from tests.e2e.test_pcap_oracle import check_info

    async with session(pool_daemon) as call:
        before = {w["worker"]: w["requests"] for w in await two_idle_workers(call, bigger, 11)}
        await check_info(call, bigger)  # an expert tap first (on one worker), then pcap_info
        after = {w["worker"]: w["requests"] for w in (await capture_details(call, bigger))["workers"]}
        assert after.keys() == before.keys() and all(after[k] > before[k] for k in before), (before, after)
        again = await call("pcap_info", pcap_path=str(bigger))  # kept: no pass again
        assert not again["_is_error"] and again["top_conversations"]
        assert {w["worker"]: w["requests"] for w in (await capture_details(call, bigger))["workers"]} == after

async def test_the_memory_budget_bounds_workers_and_evicts_the_oldest_capture(
        tmp_path_factory: pytest.TempPathFactory, bigger: Path) -> None:
    # Room for one capture's sharkd (~160 MB with nothing loaded, ~180 MB with `bigger`: a capture whose
    # estimate is over the whole budget gets no worker at all, test_pcap_over_memory.py), not for two.
    daemon = daemon_with(tmp_path_factory, "budget", "max_memory_mb = 250\nmax_loaded = 4")
    try:
        async with session(daemon) as call:
            # Loaded first (a frame tree needs the worker; pcap_info answers while it loads).
            assert not (await call("pcap_frame_detail", pcap_path=str(bigger), frame_numbers=[1]))["_is_error"]
            async with trio.open_nursery() as nursery:
                for n in (1, 2):
                    nursery.start_soon(new_filter, call, bigger, n)
            assert len((await capture_details(call, bigger))["workers"]) == 1  # a second would not fit
            other = PCAPS / "adrian_sandbox_n2.pcap"
            assert not (await call("pcap_info", pcap_path=str(other)))["_is_error"]
            with trio.fail_after(60):  # pcap_info may answer while sharkd still loads (a busy machine)
                while not all(w["state"] == "idle" for w in (await capture_details(call, other))["workers"]):
                    await trio.sleep(0.1)
            await call("pcap_info", pcap_path=str(other))  # the call after a load sees the budget exceeded
            config = await call("pcap_config_get")
            loaded = [c["details"] for c in config["loaded_captures"]]
            assert [d["path"] for d in loaded] == [str(other)], json.dumps(loaded)
            assert config["max_memory_mb"] == 250
    finally:
        daemon.stop()
        shutil.rmtree(daemon.env.runtime, ignore_errors=True)
