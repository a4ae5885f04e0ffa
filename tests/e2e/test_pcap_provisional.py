"""Progressive answers on a fresh capture: pcap_info's count and time span from capinfos at once,
and a page from an early-stopping single pass while sharkd loads, each row marked with the columns
a later frame may change. The differential test holds those marks to sharkd's two-pass rows on every
corpus capture: a column that differs and is not marked fails it, and so does a mark nothing needs."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.warm import first_page
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import LOADED_WORKER, make_env
from tests.e2e.test_pcap_differential import Call, decode_as, session
from tests.pcaps import PCAPS, PCAPS_EXTRA, corpus
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

PAGE = 5000
COLUMNS = ("number", "time_relative", "src", "dst", "protocol", "length", "info")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon of its own: every capture is fresh to it."""
    env = make_env(tmp_path, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{PCAPS_EXTRA}", "/tmp"]\ncall_timeout_s = 300\n'
                             "[pcap]\nmax_loaded = 2\n")
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


GROWN_BYTES = 40 * 1024 * 1024  # sharkd loads this in seconds; a single pass's first page takes a fraction


def grown(path: Path, tmp_path: Path) -> Path:
    """`path`'s frames again and again (mergecap -a) up to GROWN_BYTES, under a fresh name: the first call
    on it is answered by the single pass long before sharkd has loaded it, on any machine, so the test
    asserts the provisional answer instead of skipping when a small capture loaded first."""
    copies = -(-GROWN_BYTES // path.stat().st_size)
    out = tmp_path / f"grown-{path.name}"
    subprocess.run(["mergecap", "-a", "-w", str(out), *[str(path)] * copies], check=True, capture_output=True)
    return out


def reference(path: Path, argv: list[str], env: dict[str, str] | None = None) -> str:
    """What a reference tool prints for the capture `path` (argv reads it), kept on disk by its bytes, the tshark
    version, the argv and the configuration (tests/support/pcap_oracle). The captures grown here have the same
    bytes every run."""
    def run() -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    return oracle.cached_text(path, [*argv, oracle.config_key(env)], run)


def every_capture() -> list[Path]:
    found = corpus()
    if not found:
        pytest.skip(f"no real captures in {PCAPS}")
    return found


async def exact_rows(call: Call, path: Path) -> list[dict[str, Any]]:
    """Every row of the capture as sharkd gives it once loaded (the same call until it is exact)."""
    rows: list[dict[str, Any]] = []
    with trio.fail_after(600):
        while True:
            page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter="", offset=len(rows),
                              limit=PAGE, decode_as=decode_as(path))
            assert not page["_is_error"], page
            if not (page["exact"] and page["total_exact"]):
                await trio.sleep(0.2)
                continue
            rows += page["frames"]
            if not page["has_more"]:
                return rows


async def test_pcap_info_gives_capinfos_count_and_span_at_once_and_protocols_when_ready(
        daemon: DaemonProcess, bigger: Path) -> None:
    path = bigger  # ~35 MB: its protocol summary takes longer than pcap_info waits for it (INFO_WAIT_S)
    async with session(daemon) as call:
        quick = await call("pcap_info", pcap_path=str(path))
        assert not quick["_is_error"], quick
        assert quick["protocols_ready"] is False and quick["protocols"] == [] and "call again" in quick["served_by"]
        out = reference(path, ["capinfos", "-M", "-T", "-r", "-c", "-a", "-e", str(path)],
                        {"PATH": "/usr/bin:/bin", "TZ": "UTC"})
        _, count, start, end = out.strip().rsplit("\t", 3)
        assert quick["packet_count"] == int(count)
        assert quick["source"].get("sha256_pending") is True or len(quick["sha256"]) == 64
        assert quick["time_start"].startswith(start.replace(" ", "T")[:19])
        assert quick["time_end"].startswith(end.replace(" ", "T")[:19])
        with trio.fail_after(300):
            while not (full := await call("pcap_info", pcap_path=str(path)))["protocols_ready"]:
                await trio.sleep(0.2)
        assert "sctp" in full["protocols"] and full["has_protocols"]["diameter"]
        assert full["packet_count"] == quick["packet_count"] and len(full["sha256"]) == 64
        assert "sha256_pending" not in full["source"]


async def test_a_fresh_capture_answers_marked_rows_then_sharkds_exact_rows(daemon: DaemonProcess,
                                                                              tmp_path: Path) -> None:
    original = PCAPS / "5greplay_oai.pcap"  # ICMP echo requests: "(reply in N)" comes with a second pass
    if not original.exists():
        pytest.skip(f"{original} is absent")
    path = grown(original, tmp_path)
    async with session(daemon) as call:
        first = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter="icmp", limit=10)
        assert not first["_is_error"], first
        assert first["served_by"] == "tshark (single pass while sharkd loads)", first["served_by"]
        assert first["exact"] is False and "provisional" in first["note"]
        assert all(row.get("provisional") == ["info"] for row in first["frames"])
        with trio.fail_after(300):
            while not ((again := await call("pcap_frames_by_filter", pcap_path=str(path), display_filter="icmp",
                                            limit=10))["exact"] and again["total_exact"]):
                await trio.sleep(0.2)
        assert again["served_by"] in LOADED_WORKER and [r["number"] for r in again["frames"]] == \
            [r["number"] for r in first["frames"]]
        assert any("reply in" in r["info"] for r in again["frames"])
        for one, two in zip(first["frames"], again["frames"], strict=True):
            assert {c: one[c] for c in COLUMNS if c != "info"} == {c: two[c] for c in COLUMNS if c != "info"}


async def test_single_pass_rows_differ_from_two_pass_rows_only_where_marked(daemon: DaemonProcess) -> None:
    """Every row of every corpus capture, single pass (first_page.early_rows, as a fresh capture's
    page is answered) against sharkd's loaded rows. Fails on a differing column not in the row's
    `provisional`, on a MAY_DIFFER entry no difference needs, and on a MEASURED key the corpus lacks."""
    unmarked: list[tuple[str, int, str, Any, Any]] = []
    needed: set[tuple[str, str]] = set()
    sack_needed = False
    keys: set[str] = set()
    compared = 0
    async with session(daemon) as call:
        for path in every_capture():
            argv = _cold.base_argv(path, decode_as(path), ())
            single, complete = await first_page.early_rows(argv, "", 10**9)
            assert complete
            exact = await exact_rows(call, path)
            assert [r["number"] for r in single] == [r["number"] for r in exact], path.name
            for one, two in zip(single, exact, strict=True):
                key = first_page.row_key(one["protocol"])
                keys.add(key)
                marks = one.get("provisional", [])
                for column in COLUMNS:
                    if one[column] == two[column]:
                        continue
                    if column not in marks:
                        unmarked.append((path.name, one["number"], column, one[column], two[column]))
                    elif column == "info" and key not in first_page.MAY_DIFFER["info"]:
                        sack_needed = True
                    else:
                        needed.add((column, key))
                compared += 1
    assert unmarked == [], unmarked[:20]
    declared = {(column, key) for column, ks in first_page.MAY_DIFFER.items() for key in ks}
    assert declared - needed == set(), "marks no corpus row needs"
    assert sack_needed, "the SACK mark is needed by no corpus row"
    assert keys == first_page.MEASURED, (sorted(first_page.MEASURED - keys), sorted(keys - first_page.MEASURED))
    assert compared > 10000


async def test_a_fresh_capture_timeline_of_safe_fields_is_exact_from_a_single_pass(daemon: DaemonProcess,
                                                                                    tmp_path: Path) -> None:
    original = PCAPS / "magma_gx_gy_combined_04.pcapng"  # Diameter: its values need no later frame
    if not original.exists():
        pytest.skip(f"{original} is absent")
    path = grown(original, tmp_path)
    fields = ["diameter.cmd.code", "diameter.flags.request", "ip.src"]
    args = {"pcap_path": str(path), "display_filter": "diameter", "fields": fields, "limit": 30, "offset": 3}
    async with session(daemon) as call:
        first = await call("pcap_timeline", **args)
        assert not first["_is_error"], first
        assert first.get("served_by") == "tshark (single pass while sharkd loads)", first.get("served_by")
        assert first["total_exact"] is False and first["total_at_least"] == 34 and first["has_more"]
        # Exactly what two-pass tshark prints, run here.
        two = [line.split("\t") for line in reference(path, [
            "tshark", "-r", str(path), "-n", "-2", "-Y", "diameter", "-T", "fields", "-E", "occurrence=f",
            "-e", "frame.number", *[a for f in fields for a in ("-e", f)]]).splitlines()]
        assert [[str(r["frame.number"]), *[str(r[f]) for f in fields]] for r in first["rows"]] == two[3:33]
        with trio.fail_after(300):
            while (again := await call("pcap_timeline", **args)).get("served_by") is not None:
                await trio.sleep(0.2)  # still loading: the next call after the load is sharkd's
        assert again["total_exact"] is True and again["total"] == len(two) and again["rows"] == first["rows"]


async def test_a_loaded_capture_answers_an_uncounted_filters_timeline_from_a_single_pass_then_counts_it(
        daemon: DaemonProcess) -> None:
    path = PCAPS / "magma_gx_gy_combined_04.pcapng"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    fields = ["diameter.cmd.code", "diameter.flags.request", "ip.src"]
    async with session(daemon) as call:
        with trio.fail_after(300):  # loaded first: pcap_info until sharkd answers it
            while (await call("pcap_info", pcap_path=str(path)))["served_by"] != "sharkd":
                await trio.sleep(0.2)
        two = [line.split("\t") for line in reference(path, [
            "tshark", "-r", str(path), "-n", "-2", "-Y", "diameter.flags.request == 1", "-T", "fields", "-E",
            "occurrence=f", "-e", "frame.number", *[a for f in fields for a in ("-e", f)]]).splitlines()]
        args = {"pcap_path": str(path), "display_filter": "diameter.flags.request == 1", "fields": fields,
                "limit": 10}
        first = await call("pcap_timeline", **args)
        assert not first["_is_error"], first
        # The frame set is not counted yet: a single pass gives the page (values exact), the total is a floor.
        assert first["served_by"].startswith("tshark (single pass before sharkd's count")
        assert first["total_exact"] is False and first["total_at_least"] == 11 and first["has_more"]
        assert [[str(r["frame.number"]), *[str(r[f]) for f in fields]] for r in first["rows"]] == two[:10]
        again = await call("pcap_timeline", **args)  # the same call again counts every match
        assert again["total_exact"] is True and again["total"] == len(two) > 11 and again["rows"] == first["rows"]
        assert "served_by" not in again
        # A filter counted already (by pcap_frames_by_filter's pass) is answered exactly at once.
        counted = {**args, "display_filter": "diameter.flags.request == 0"}
        with trio.fail_after(300):
            while not (await call("pcap_frames_by_filter", pcap_path=str(path),
                                  display_filter=counted["display_filter"], limit=1))["total_exact"]:
                await trio.sleep(0.2)
        exact = await call("pcap_timeline", **counted)
        assert exact["total_exact"] is True and "served_by" not in exact
        answers = [line.split("\t") for line in reference(path, [
            "tshark", "-r", str(path), "-n", "-2", "-Y", counted["display_filter"], "-T", "fields", "-E",
            "occurrence=f", "-e", "frame.number", *[a for f in fields for a in ("-e", f)]]).splitlines()]
        assert exact["total"] == len(answers) and exact["has_more"] is (len(answers) > 10)
        assert [[str(r["frame.number"]), *[str(r[f]) for f in fields]] for r in exact["rows"]] == answers[:10]
