"""The standby of any field list (fields_standby.py): its lines are the cold `tshark -T fields` run's, for
every field of its types that a corpus capture has, frame by frame; what it cannot print runs cold."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest
import trio

from diagd.actors._subprocess import Head, head
from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.shark.wireshark import Catalogue, read_catalogue
from diagd.actors.pcap.warm import fields_standby, first_page, standby
from tests.pcaps import PCAPS, corpus
from tests.support import pcap_oracle as oracle

FRAMES = "frame.number <= 120"  # the first frames of each capture: every field they have
PER_RUN = 150  # fields per run (one tshark each way)


def fields_argv(path: Path, display_filter: str, names: list[str]) -> list[str]:
    """The argv of a timeline's early pass (answers.timeline_while_loading, first_page.early_fields)."""
    argv = _cold.fields_argv(first_page.single_pass(_cold.base_argv(path, (), ())), display_filter,
                             ["frame.number", *names])
    return [argv[0], "-l", *argv[1:]]


async def warm(argv: list[str], limit: int | None = None) -> Head:
    """The run of a standby of any field list for `argv` (started, run once, stopped)."""
    found = standby.template_of(argv)
    assert found is not None, argv
    template, path, display_filter = found
    any_list = standby.any_fields_of(template)
    assert any_list is not None, argv
    waiting = await standby.Standby.start(any_list[0])
    try:
        return await waiting.run(path, display_filter, limit, 1 << 30, None, any_list[1])
    finally:
        await waiting.close()
        assert not waiting.directory.exists()


async def names_in(path: Path, cat: Catalogue) -> list[str]:
    """The fields the first frames of `path` have that the standby serves."""
    argv = ["tshark", "-n", "-r", str(path), "-Y", FRAMES, "-T", "pdml"]

    def pdml() -> str:  # tshark's own (the reference), kept on disk by capture, argv and environment
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout

    text = await trio.to_thread.run_sync(oracle.cached_text, path, [*argv, oracle.config_key()], pdml)
    found = sorted(set(re.findall(r'<field name="([^"]+)"', text)))
    return [name for name in found if fields_standby.servable([name], cat)]


async def test_its_lines_are_the_cold_runs_for_every_field_of_its_types_on_every_corpus_capture() -> None:
    captures = corpus()
    if not captures:
        pytest.skip(f"no real captures in {PCAPS}")
    cat = await read_catalogue()
    checked: set[str] = set()
    unsure: list[tuple[str, list[str]]] = []
    lines = several = escaped = 0

    async def compare(path: Path) -> None:
        nonlocal lines, several, escaped
        names = await names_in(path, cat)
        for at in range(0, len(names), PER_RUN):
            chunk = names[at:at + PER_RUN]
            argv = fields_argv(path, FRAMES, chunk)
            warm_run, cold = await warm(argv), await head(argv, None, max_line=1 << 30)
            if warm_run.returncode == fields_standby.UNSURE_EXIT:  # then the call runs cold
                unsure.append((path.name, chunk))
                assert warm_run.lines == cold.lines[:len(warm_run.lines)], (path.name, chunk)
                continue
            assert warm_run.returncode == cold.returncode == 0, (path.name, warm_run.stderr)
            for number, (one, two) in enumerate(zip(warm_run.lines, cold.lines, strict=True)):
                assert one == two, (path.name, number, [
                    (name, a, b) for name, a, b in zip(["frame.number", *chunk], one.split("\t"), two.split("\t"),
                                                       strict=True) if a != b])
            checked.update(chunk)
            lines += len(cold.lines)
            several += sum(_cold.AGGREGATOR in line for line in cold.lines)  # the pre-order walk's rows
            escaped += sum(bool(re.search(r"\\[rnt]", line)) for line in cold.lines)  # control characters

    limiter = trio.CapacityLimiter(2)

    async def limited(path: Path) -> None:
        async with limiter:
            await compare(path)

    async with trio.open_nursery() as nursery:
        for path in captures:
            nursery.start_soon(limited, path)
    kinds = {cat.fields[name][1] for name in checked}
    assert len(checked) > 1500 and lines > 1000 and several > 100 and escaped > 10, (len(checked), lines, several,
                                                                                    escaped)
    assert {"FT_NONE", "FT_STRING", "FT_UINT32", "FT_BOOLEAN", "FT_IPv4", "FT_ABSOLUTE_TIME"} <= kinds
    assert len(unsure) <= math.ceil(len(captures) / 10), unsure  # a name registered twice with two types


async def test_a_name_registered_with_bytes_too_stops_the_run_before_its_frame() -> None:
    """nr-rrc.scs_30kHz is registered twice (FT_UINT32 and a BIT STRING's bytes): the bytes' text is
    hex per the field's display, which the script cannot read, so it stops (the call runs cold)."""
    path = next((p for p in corpus() if p.name == "oaifed_cotsue_core.pcap"), None)
    if path is None:
        pytest.skip(f"oaifed_cotsue_core.pcap not in {PCAPS}")
    argv = fields_argv(path, "nr-rrc.scs_30kHz", ["nr-rrc.scs_30kHz"])
    warm_run = await warm(argv)
    assert warm_run.returncode == fields_standby.UNSURE_EXIT and not warm_run.stopped
    assert "no text for nr-rrc.scs_30kHz" in warm_run.stderr


def test_which_field_lists_it_serves() -> None:
    cat = Catalogue({"ip.src": ("", "FT_IPv4", "ip"), "diameter.avp": ("", "FT_BYTES", "diameter"),
                     "ngap.NGAP_PDU": ("", "FT_UINT32", "ngap"), "tcp.analysis": ("", "FT_NONE", "tcp"),
                     "_ws.expert.message": ("", "FT_STRING", "_ws.expert")},
                    {"ip": "IP", "diameter": "Diameter", "ngap": "NGAP", "tcp": "TCP"}, "4.0")
    assert fields_standby.servable(["ip.src", "ngap.NGAP_PDU", "tcp.analysis"], cat)
    for refused in (["diameter.avp"], ["ip"], ["_ws.expert.message"], ["_ws.col.Info"], ["no.such"]):
        assert not fields_standby.servable(["ip.src", *refused], cat), refused
    newer = Catalogue({"ip.src": ("", "FT_IPv4", "ip")}, {"ip": "IP"}, "TShark (Wireshark) 4.2.5")
    assert not fields_standby.servable(["ip.src"], newer)  # held to 4.0 by the differential test


def test_only_the_timeline_options_make_a_template_of_any_list() -> None:
    argv = fields_argv(Path("/c.pcap"), "ip", ["ip.src", "udp.srcport"])
    template = standby.template_of(argv)
    assert template is not None
    any_list = standby.any_fields_of(template[0])
    assert any_list is not None and any_list[1] == ("frame.number", "ip.src", "udp.srcport")
    assert any_list[0].any_fields and "<fields>" in any_list[0].shown()
    other = standby.any_fields_of(standby.template_of(fields_argv(Path("/d.pcap"), "udp", ["ip.dst"]))[0])  # type: ignore[index]
    assert other is not None and other[0].key == any_list[0].key  # one template for every list
    with_column = standby.template_of(fields_argv(Path("/c.pcap"), "ip", ["_ws.col.Info"]))
    assert with_column is not None and standby.any_fields_of(with_column[0]) is None  # a column preference
    two_pass = standby.template_of(_cold.fields_argv(_cold.base_argv(Path("/c.pcap"), (), ()), "ip", ["ip.src"]))
    assert two_pass is not None and "-2" in two_pass[0].argv and standby.any_fields_of(two_pass[0]) is None
    rows = standby.template_of(first_page.tabs_argv(_cold.base_argv(Path("/c.pcap"), (), ()), "ip"))
    assert rows is not None and standby.any_fields_of(rows[0]) is None


async def test_a_name_given_twice_fills_its_last_column_only_as_tshark_does() -> None:
    path = next((p for p in corpus() if p.name == "magma_gx_gy_combined_04.pcapng"), None)
    if path is None:
        pytest.skip(f"magma_gx_gy_combined_04.pcapng not in {PCAPS}")
    argv = fields_argv(path, "diameter", ["diameter.Session-Id", "diameter.avp.code", "diameter.Session-Id"])
    warm_run, cold = await warm(argv, 50), await head(argv, 50, max_line=1 << 30)
    assert warm_run.lines == cold.lines and len(cold.lines) == 50
    assert all(line.split("\t")[1] == "" for line in cold.lines) and any(line.split("\t")[3] for line in cold.lines)


async def test_the_daemon_runs_a_list_on_it_and_one_it_cannot_print_cold_then_on_its_own_standby(
        tmp_path: Path) -> None:
    """WarmTsharks.run_head: a servable list is served by the standby of any list; a list whose frame
    holds an item the script cannot print (UNSURE_EXIT) is answered cold, remembered, and its next run
    goes to its own list's template."""
    from tests.support.fake_runtime import fake_runtime

    path = next((p for p in corpus() if p.name == "oaifed_cotsue_core.pcap"), None)
    if path is None:
        pytest.skip(f"oaifed_cotsue_core.pcap not in {PCAPS}")
    plain = fields_argv(path, "ip", ["ip.src", "ip.dst"])
    mixed = fields_argv(path, "nr-rrc.scs_30kHz", ["nr-rrc.scs_30kHz"])
    any_list = standby.any_fields_of(standby.template_of(plain)[0])  # type: ignore[index]
    own = standby.template_of(mixed)[0]  # type: ignore[index]
    assert any_list is not None
    async with fake_runtime(tmp_path, "pcap") as rt:
        warm_tsharks = standby.WarmTsharks(rt)  # type: ignore[arg-type]

        async def waiting() -> standby.StandbyActor:
            ref = await warm_tsharks.start(any_list[0], 600)
            actor = ref.actor
            assert isinstance(actor, standby.StandbyActor)
            with trio.fail_after(30):
                while not actor.statistics()["waiting"]:
                    await trio.sleep(0.05)
            return actor

        actor = await waiting()
        served = await warm_tsharks.run_head(plain, 20, max_line=1 << 30)
        assert served.lines == (await head(plain, 20, max_line=1 << 30)).lines
        assert actor.statistics()["served"] == 1
        await waiting()
        cold = await head(mixed, None, max_line=1 << 30)
        assert (await warm_tsharks.run_head(mixed, None, max_line=1 << 30)).lines == cold.lines
        assert actor.statistics()["unsure"] == 1 and actor.statistics()["served"] == 1
        assert rt.find(standby.KIND, own.key) is None
        assert (await warm_tsharks.run_head(mixed, None, max_line=1 << 30)).lines == cold.lines
        assert rt.find(standby.KIND, own.key) is not None  # its own list's standby starts after that run


def test_a_frame_the_tap_missed_is_not_a_whole_row() -> None:
    assert fields_standby.whole_rows(["1\t10.0.0.1\t", "2\t\t"], 3)
    assert not fields_standby.whole_rows(["1\t10.0.0.1\t", ""], 3)  # tshark's newline alone
    assert not fields_standby.whole_rows(["1\t10.0.0.1\t2\t\t"], 3)
    assert not fields_standby.whole_rows([""], 1)
