"""A capture's count and span from its own record headers (recordwalk.py, walked in C) against one capinfos
run over the whole file: the same table cells, or none (then pcap_info runs capinfos). Every capture of
both corpora, and built files for what the corpus lacks (tests/support/capinfos_captures.py)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from diagd.actors.pcap.shark import recordwalk
from diagd.actors.pcap.shark import tshark as cold
from tests.pcaps import corpus
from tests.support.capinfos_captures import ENV, T0, built, pcap, reference

pytestmark = [
    pytest.mark.skipif(shutil.which("capinfos") is None, reason="capinfos (Wireshark) is not installed"),
    pytest.mark.skipif(not recordwalk.available(), reason="diagd was installed without its C record walker"),
]
__all__ = ["built"]  # the fixture, used by name

WALKED = ["ns.pcap", "be.pcap", "out_of_order.pcap", "alike_interfaces_be.pcapng"]
NOT_WALKED = ["two_resolutions.pcapng", "two_resolutions_be.pcapng", "milliseconds.pcapng",
              "tie.pcapng", "tsoffset.pcapng", "rounded.pcapng",
              "two_sections.pcapng", "no_packets.pcapng", "unnormalized.pcap", "cut_short.pcap",
              "simple_packet.pcapng", "power_of_two.pcapng", "late_interface.pcapng"]


@pytest.mark.parametrize("name", WALKED)
async def test_built_captures_are_walked_to_one_capinfos_runs_cells(built: dict[str, Path], name: str) -> None:
    assert await recordwalk.count(built[name], ENV) == reference(built[name])


@pytest.mark.parametrize("name", NOT_WALKED)
async def test_what_the_walk_cannot_answer_exactly_is_left_to_capinfos(built: dict[str, Path], name: str) -> None:
    assert await recordwalk.count(built[name], ENV) is None


def test_every_built_capture_is_named_walked_or_not(built: dict[str, Path]) -> None:
    assert sorted(WALKED + NOT_WALKED) == sorted(built)


async def test_every_corpus_capture_is_walked_to_one_capinfos_runs_cells() -> None:
    files = corpus()
    if not files:
        pytest.skip("no corpus capture in the cache")
    walked = [path.name for path in files if (got := await recordwalk.count(path, ENV)) is not None
              and _same(got, reference(path), path)]
    assert len(walked) == len(files), sorted({p.name for p in files} - set(walked))  # every one, multi-interface too


def _same(got: tuple[str, ...], want: tuple[str, ...], path: Path) -> bool:
    assert got == want, path.name
    return True


async def test_a_capture_that_changes_under_the_walk_is_left_to_capinfos(tmp_path: Path) -> None:
    path = pcap(tmp_path / "a.pcap", [(T0 + i, i) for i in range(20)])
    found = recordwalk.read_layout(path)
    assert found is not None and recordwalk.walk(path, found) is not None
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 20, 105)  # another link type: not the header capinfos was shown
    path.write_bytes(bytes(data))
    assert recordwalk.walk(path, found) is None


async def test_facts_through_capinfos_alone_and_through_the_walk_are_the_same(
        built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    walked = cold.Capinfos()
    for name in WALKED:
        facts = await walked.capture_facts(built[name], f"walked-{name}", built[name].stat().st_size)
        monkeypatch.setattr(recordwalk, "_recordwalk", None)
        alone = await cold.Capinfos().capture_facts(built[name], f"alone-{name}", built[name].stat().st_size)
        monkeypatch.undo()
        assert facts == alone, name
