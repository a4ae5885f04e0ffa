"""First page first (issue 12): a new filter's first page may be found by an early-stopping tshark
before sharkd's full pass. The frames it finds must be the frames sharkd's filter matches: compared
here, on every shared capture, for every protocol the capture carries (and a few value filters),
with the page sharkd returns once its pass is done (`total_exact`). Also: the early page's rows are
sharkd's rows, it says its total is a lower bound, the next call gives the exact total, and filters
naming fields that depend on later frames are never raced."""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.shark.wireshark import read_catalogue
from diagd.actors.pcap.warm import first_page
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.e2e.test_pcap_differential import Call, captures, decode_as, session
from tests.pcaps import PCAPS
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

LIMIT = 20
SKIP = {"frame", "eth", "sll", "null", "raw", "data", "_ws.malformed", "_ws.expert"}


@pytest.fixture(scope="module")
def fp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("firstpage")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "/tmp"]\ncall_timeout_s = 120\n'
                         "[pcap]\nmax_loaded = 2\n")
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


async def exact_page(call: Call, path: Path, display_filter: str, offset: int) -> dict[str, Any]:
    """The page once sharkd's pass is done (the same call again until its total is exact)."""
    with trio.fail_after(120):
        while True:
            page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter=display_filter,
                              offset=offset, limit=LIMIT, decode_as=decode_as(path))
            assert not page["_is_error"], page
            if page["total_exact"] and page["exact"]:
                return page
            await trio.sleep(0.05)


OFFSETS = (0, 7)  # the first page and one that starts within the early pass's frames


def filters_for(protocols: list[str]) -> list[str]:
    """Every protocol of the capture that first pages are raced for, and two value filters."""
    chosen = [p for p in protocols if p in first_page.SINGLE_PASS_PROTOCOLS and p not in SKIP]
    return [*chosen, "frame.len > 200", "ip.ttl < 64 || ipv6", "udp.length > 100 || sctp.chunk_length > 100"]


async def test_early_rows_are_sharkds_rows_on_every_capture(fp_daemon: DaemonProcess) -> None:
    compared = 0
    async with session(fp_daemon) as call:
        for path in captures():
            with trio.fail_after(300):  # the protocols: with the first call, or a later one
                while not (info := await call("pcap_info", pcap_path=str(path),
                                              decode_as=decode_as(path))).get("protocols_ready"):
                    assert not info["_is_error"], info
                    await trio.sleep(0.2)
            argv = _cold.base_argv(path, decode_as(path), ())
            for display_filter in filters_for(info["protocols"]):
                # One early pass per filter serves both pages (the second's frames hold the first's):
                # a tshark start is most of this test's time.
                numbers, complete = await first_page.early_numbers(argv, display_filter, max(OFFSETS) + LIMIT)
                for offset in OFFSETS:
                    exact = await exact_page(call, path, display_filter, offset)
                    where = (path.name, display_filter, offset)
                    assert numbers[offset:offset + LIMIT] == [f["number"] for f in exact["frames"]], where
                    if complete:
                        assert len(numbers) == exact["total"], where
                    else:
                        assert exact["total"] > offset + LIMIT, where
                    compared += 1
    assert compared > 100


async def test_a_new_filter_says_its_total_is_a_lower_bound_then_exact(fp_daemon: DaemonProcess,
                                                                      bigger: Path) -> None:
    path = bigger  # big enough for a pass to take longer than tshark's first matches
    async with session(fp_daemon) as call:
        await call("pcap_info", pcap_path=str(path))
        seen_early = False
        for length in range(60, 90):  # new filters each time: matches come early, the total late
            page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter=f"frame.len > {length}",
                              limit=5)
            if not page["total_exact"]:
                seen_early = True
                assert page["total_at_least"] == page["total"] == 6 and page["has_more"]
                assert "same call again" in page["note"]
                assert "found by tshark" in page["served_by"] or "single pass" in page["served_by"]
                exact = await exact_page(call, path, f"frame.len > {length}", 0)
                assert exact["total"] > 6
                for early, final in zip(page["frames"], exact["frames"][:5], strict=True):
                    marked = early.pop("provisional", [])  # a single pass's row: exact but for these
                    assert {k: v for k, v in early.items() if k not in marked} == \
                        {k: v for k, v in final.items() if k not in marked}
                break
        assert seen_early, "no first page came before sharkd's pass"


def test_only_single_pass_protocols_without_later_links_are_raced() -> None:
    cat = trio.run(read_catalogue)

    def raced(display_filter: str, offset: int = 0, limit: int = 20) -> bool:
        return first_page.raceable(display_filter, offset, limit, cat.kinds(display_filter))

    assert raced("pfcp.msg_type == 1 && ip.addr == 10.0.0.1")
    assert raced('sip.Method == "INVITE" or pfcp')
    assert not raced("sip.Method == INVITE")  # a bare word: unsure
    assert not raced("pfcp && !pfcp.response_in")
    assert not raced("tcp.reassembled_in == 5")
    assert not raced("json")
    assert not raced("http2.streamid == 1")
    assert not raced("icmp.no_resp")
    assert not raced("udp.stream == 3")
    assert not raced("_ws.expert.severity == 4")
    assert not raced("")
    assert not raced("pfcp", first_page.MAX_EARLY_ROWS, 20)
    assert not raced("pfcp", 0, first_page.MAX_EARLY_PAGE + 1)
    assert not first_page.raceable("pfcp", 0, 20, None)  # names not looked up: no


def layer_values(layers: Any, out: list[tuple[str, str]], key: str = "") -> None:
    """Every (field, value) of one frame of `tshark -T json` (trees flattened)."""
    if isinstance(layers, dict):
        for name, value in layers.items():
            layer_values(value, out, name) if isinstance(value, dict | list) else out.append((name, str(value)))
    elif isinstance(layers, list):
        for value in layers:
            layer_values(value, out, key) if isinstance(value, dict | list) else out.append((key, str(value)))


def passes_differ(path: Path) -> set[str]:
    """The fields and protocols tshark's single pass gives differently from its `-2` on one capture, from
    both `tshark -T json` outputs compared field by field. Kept on disk as that set (tshark's side alone;
    the raw JSON would be hundreds of MB), keyed by both runs and this comparison's code."""
    def argv(two_pass: bool) -> list[str]:
        return ["tshark", "-r", str(path), "-n", *(["-2"] if two_pass else []),
                *[a for r in decode_as(path) for a in ("-d", r)], "-T", "json", "--no-duplicate-keys"]

    def frames(two_pass: bool) -> list[Any]:
        done = subprocess.run(argv(two_pass), capture_output=True, text=True, check=False, timeout=300)
        return list(json.loads(done.stdout or "[]"))

    def compute() -> str:
        differing: set[str] = set()
        for one, two in zip(frames(False), frames(True), strict=True):
            a: list[tuple[str, str]] = []
            b: list[tuple[str, str]] = []
            layer_values(one["_source"]["layers"], a)
            layer_values(two["_source"]["layers"], b)
            ca, cb = Counter(a), Counter(b)
            differing |= {name for name, _ in (ca - cb) + (cb - ca)}
            pa = set(dict(a)["frame.protocols"].split(":"))
            pb = set(dict(b)["frame.protocols"].split(":"))
            differing |= pa ^ pb
        return json.dumps(sorted(differing))

    code = hashlib.sha256((inspect.getsource(layer_values) + inspect.getsource(passes_differ)).encode()).hexdigest()
    key = [*argv(False), "|", *argv(True), oracle.config_key(), f"compared by {code[:16]}"]
    return set(json.loads(oracle.cached_text(path, key, compute)))


def test_fields_a_single_pass_gives_differently_are_never_raced() -> None:
    """Both passes of tshark on every corpus capture, field by field: whatever differs between a
    single pass and `-2` must be refused by single_pass_safe (a field, or a protocol that appears
    in one and not the other)."""
    cat = trio.run(read_catalogue)
    differing: set[str] = set()
    for path in captures():
        differing |= passes_differ(path)
    unsafe_but_raced = sorted(n for n in differing if first_page.single_pass_safe(cat.kinds(n)))
    assert unsafe_but_raced == [], unsafe_but_raced
