"""pcap_text_search on a capture still loading searches the text of a single tshark pass; sharkd's
text is two-pass. single_pass_text says which lines of a single pass a second pass may print
otherwise, and which lines it may add. This differential test holds those rules to real tshark on
every corpus capture, `tshark -V` against `tshark -2 -V` frame by frame: a line not marked that the
second pass does not print fails it, and so does a line the second pass adds that no rule names;
a rule no difference needs fails it too (so a mark cannot be removed or added unnoticed).

A real daemon then answers a fresh capture's search from the single pass and, once loaded, from
sharkd: the matches on lines not marked are the same, and sharkd's other matches are on lines the
rules name."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trio

from diagd.actors.pcap import single_pass_text as spt
from tests.conftest import DaemonProcess
from tests.e2e.test_pcap_differential import decode_as, session
from tests.e2e.test_pcap_provisional import daemon as _daemon  # noqa: F401 (the `daemon` fixture: a daemon of its own)
from tests.pcaps import PCAPS, PCAPS_EXTRA, corpus

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed"),
]

Lines = Counter[tuple[str, str]]


def frames(wsconf: Path, path: Path, *extra: str) -> dict[int, str]:
    argv = ["tshark", "-n", "-r", str(path), *[a for r in decode_as(path) for a in ("-d", r)], *extra, "-V"]
    out = subprocess.run(argv, capture_output=True, check=False, timeout=600,
                         env={**os.environ, "WIRESHARK_CONFIG_DIR": str(wsconf)}).stdout
    return {f.number: f.text for f in spt.frames_of(out.decode(errors="replace").split("\n"))}


class Differences:
    """Per corpus capture, the lines only the single pass prints (`gone`) and only the second
    pass prints (`added`), with their layers."""

    def __init__(self, wsconf: Path) -> None:
        self.by_capture: dict[str, tuple[Lines, Lines, Lines]] = {}  # name -> (gone, added, exact lines gone)
        self.layers: set[str] = set()
        captures = corpus()
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            done = pool.map(lambda p: (p, frames(wsconf, p), frames(wsconf, p, "-2")), captures)
            for path, one, two in done:
                assert one.keys() == two.keys(), path.name
                gone, added, wrong = Counter[tuple[str, str]](), Counter[tuple[str, str]](), Counter[tuple[str, str]]()
                for number, text in one.items():
                    single, double = Counter(spt.layered(text)), Counter(spt.layered(two[number]))
                    self.layers.update(layer for layer, _ in single)
                    gone += single - double
                    added += double - single
                    exact = Counter({k: v for k, v in single.items() if not spt.may_differ(*k)})
                    wrong += exact - double
                self.by_capture[path.name] = (gone, added, wrong)

    def all(self) -> Iterator[tuple[str, str]]:
        for gone, added, _ in self.by_capture.values():
            yield from gone
            yield from added


@pytest.fixture(scope="module")
def differences(tmp_path_factory: pytest.TempPathFactory) -> Differences:
    if not corpus():
        pytest.skip(f"no real captures in {PCAPS} or {PCAPS_EXTRA}")
    return Differences(tmp_path_factory.mktemp("wsconf"))


def test_a_single_pass_line_not_marked_is_printed_by_the_second_pass(differences: Differences) -> None:
    wrong = {name: sorted(lines)[:5] for name, (_, _, lines) in differences.by_capture.items() if lines}
    assert not wrong, f"single-pass lines not marked that tshark -2 -V prints otherwise: {wrong}"


def test_every_line_the_second_pass_adds_is_of_a_kind_named(differences: Differences) -> None:
    unnamed = {name: sorted(k for k in added if not spt.may_differ(*k))[:5]
               for name, (_, added, _) in differences.by_capture.items()}
    assert not {k: v for k, v in unnamed.items() if v}, f"lines tshark -2 -V adds that no rule names: {unnamed}"


def test_every_rule_is_needed_by_a_difference(differences: Differences) -> None:
    differing = list(differences.all())
    layers = {layer for layer, _ in differing}
    unneeded_layers = sorted(spt.MAY_DIFFER_LAYERS - layers)
    assert not unneeded_layers, f"MAY_DIFFER_LAYERS entries no difference needs: {unneeded_layers}"
    others = [line.strip() for layer, line in differing if layer not in spt.MAY_DIFFER_LAYERS]
    unneeded = [rule for rule in spt.MAY_DIFFER_LINES if not any(re.match(rule, line) for line in others)]
    assert not unneeded, f"MAY_DIFFER_LINES rules no difference needs: {unneeded}"
    assert differences.layers == spt.MEASURED_LAYERS, (
        f"measured layers not in the corpus: {sorted(spt.MEASURED_LAYERS - differences.layers)}; corpus layers "
        f"not measured: {sorted(differences.layers - spt.MEASURED_LAYERS)}")


def test_the_mark_at_an_offset_is_the_mark_of_its_line_in_its_layer(tmp_path: Path) -> None:
    """single_pass_text.Lines (what a search asks per match) against layered + may_differ, every line."""
    checked = 0
    for path in [p for p in corpus() if p.name in ("5greplay_oai.pcap", "tempo_MAGMA-MASTER-DSTESTER.pcap")]:
        for text in list(frames(tmp_path, path).values())[:400]:
            lines = spt.Lines(text)
            offset = 0
            for layer, line in spt.layered(text):
                for at in {offset, offset + len(line) // 2, offset + max(len(line) - 1, 0)}:
                    assert lines.may_differ(at) == spt.may_differ(layer, line), (path.name, line)
                offset += len(line) + 1
                checked += 1
    if not checked:
        pytest.skip("5greplay_oai.pcap and tempo_MAGMA-MASTER-DSTESTER.pcap are not in the corpus")


SEARCHES = [  # (capture, filter, query): a Diameter, an NGAP, a SIP-over-TCP and a PFCP search
    ("magma_gx_gy_combined_04.pcapng", "diameter", "Session-Id"),
    ("5greplay_oai.pcap", "ngap || pfcp", "Response In"),
    ("heplify_sip_ipv4_tcp.pcap", "sip", "Conversation completeness"),
    ("adrian_n4_upf_timeout_n4.pcap", "pfcp", "Sequence Number"),
]


async def test_a_fresh_capture_searches_the_single_pass_then_sharkds_text(daemon: DaemonProcess,
                                                                        tmp_path: Path) -> None:
    compared = 0
    async with session(daemon) as call:
        for name, flt, query in SEARCHES:
            source = next((p for p in corpus() if p.name == name), None)
            if source is None:
                continue
            fresh = tmp_path / f"fresh-{name}"  # a path no worker has loaded
            shutil.copyfile(source, fresh)
            args = {"pcap_path": str(fresh), "display_filter": flt, "query": query, "limit": 100,
                    "max_matches": 1000, "snippet_context_chars": 0, "decode_as": decode_as(source)}
            early = await call("pcap_text_search", **args)
            assert not early["_is_error"], early
            if early.get("served_by") is None:
                continue  # loaded before the call got there (a small capture)
            assert early["exact"] is False and "single pass" in early["served_by"]
            with trio.fail_after(300):
                while True:
                    exact = await call("pcap_text_search", **args)
                    assert not exact["_is_error"], exact
                    if "served_by" not in exact:
                        break
                    await trio.sleep(0.2)
            assert exact["frames_scanned"] == early["frames_scanned"], name
            kept = [(m["frame_number"], m["line"]) for m in early["matches"] if "line" not in m["provisional"]]
            two = [(m["frame_number"], m["line"]) for m in exact["matches"]]
            assert not Counter(kept) - Counter(two), f"{name}: a match on a line not marked is not sharkd's"
            for number, line in sorted(set(two) - set(kept)):
                # A match only sharkd's text has, or on a line marked: a line the rules name, in its layer.
                detail = await call("pcap_frame_detail", pcap_path=str(fresh), frame_numbers=[number],
                                    decode_as=decode_as(source), max_bytes=2 * 1024 * 1024)
                assert not detail["_is_error"], detail
                layers = [layer for layer, text in spt.layered(detail["frames"][0]["text"]) if text.strip() == line]
                assert layers and any(spt.may_differ(layer, line) for layer in layers), (name, number, line)
            compared += 1
    assert compared >= 2, "fewer than two fresh searches were answered from a single pass"
