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

import itertools
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

from diagd.actors.pcap.shark import single_pass_text as spt
from tests.conftest import DaemonProcess
from tests.e2e.test_pcap_differential import decode_as, session
from tests.e2e.test_pcap_provisional import daemon as _daemon  # noqa: F401 (the `daemon` fixture: a daemon of its own)
from tests.pcaps import PCAPS, PCAPS_EXTRA, corpus
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed"),
]

Lines = Counter[tuple[str, str]]


def frames(wsconf: Path, path: Path, *extra: str) -> dict[int, str]:
    argv = ["tshark", "-n", "-r", str(path), *[a for r in decode_as(path) for a in ("-d", r)], *extra, "-V"]

    def run() -> str:  # tshark's text, kept on disk: this module compares the rules with it, not diagd
        return subprocess.run(argv, capture_output=True, check=False, timeout=600,
                              env={**os.environ, "WIRESHARK_CONFIG_DIR": str(wsconf)}).stdout.decode(errors="replace")
    return {f.number: f.text for f in spt.frames_of(oracle.cached_text(path, argv, run))}


class Differences:
    """Per corpus capture, the lines only the single pass prints (`gone`) and only the second
    pass prints (`added`), with their layers."""

    def __init__(self, wsconf: Path) -> None:
        self.by_capture: dict[str, tuple[Lines, Lines, Lines]] = {}  # name -> (gone, added, exact lines gone)
        self.layers: set[str] = set()
        # Plain frames (no single-pass line in a layer that may differ): their differing lines, and
        # the layers only their second pass has.
        self.plain: dict[str, Lines] = {}
        self.plain_new_layers: dict[str, set[str]] = {}
        captures = corpus()
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            done = pool.map(lambda p: (p, frames(wsconf, p), frames(wsconf, p, "-2")), captures)
            for path, one, two in done:
                assert one.keys() == two.keys(), path.name
                gone, added, wrong = Counter[tuple[str, str]](), Counter[tuple[str, str]](), Counter[tuple[str, str]]()
                plain, new_layers = Counter[tuple[str, str]](), set()
                for number, text in one.items():
                    single, double = Counter(spt.layered(text)), Counter(spt.layered(two[number]))
                    if spt.is_plain(spt.layers_of(text)):
                        plain += (single - double) + (double - single)
                        new_layers |= spt.layers_of(two[number]) - spt.layers_of(text)
                    self.layers.update(layer for layer, _ in single)
                    gone += single - double
                    added += double - single
                    exact = Counter({k: v for k, v in single.items() if not spt.may_differ(*k)})
                    wrong += exact - double
                self.by_capture[path.name] = (gone, added, wrong)
                self.plain[path.name], self.plain_new_layers[path.name] = plain, new_layers

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


def test_a_plain_frames_second_pass_differs_only_in_lines_of_the_shapes_named_for_its_layers(
        differences: Differences) -> None:
    """What pcap_text_search's rule-out stands on (single_pass_text.PLAIN_FRAME_LINES): in a frame
    whose single-pass text has no line in a layer that may differ, the second pass opens no layer
    and every line it changes, drops or adds is whole one of the shapes of its layer."""
    new_layers = {name: layers for name, layers in differences.plain_new_layers.items() if layers}
    assert not new_layers, f"a second pass opened layers in plain frames: {new_layers}"
    unshaped = {name: sorted(k for k in lines if not any(
        re.fullmatch(shape, k[1].strip()) for shape in spt.PLAIN_FRAME_LINES.get(k[0], ())))[:5]
        for name, lines in differences.plain.items()}
    assert not {k: v for k, v in unshaped.items() if v}, f"plain-frame differences no shape names: {unshaped}"
    used = {(layer, shape) for lines in differences.plain.values() for layer, line in lines
            for shape in spt.PLAIN_FRAME_LINES.get(layer, ()) if re.fullmatch(shape, line.strip())}
    unneeded = sorted((layer, shape) for layer, shapes in spt.PLAIN_FRAME_LINES.items() for shape in shapes
                      if (layer, shape) not in used)
    assert not unneeded, f"PLAIN_FRAME_LINES shapes no plain-frame difference needs: {unneeded}"


def test_a_literal_no_shape_can_hold_is_ruled_out_and_one_a_shape_can_hold_is_not() -> None:
    """single_pass_text.may_contain against the shapes' own strings: every differing line of a
    plain frame contains each of its substrings by the model, and a few literals no shape holds."""
    assert spt.layers_that_may_gain("IMSI999991234567810", False) == {"Session Initiation Protocol", "MEGACO"}
    assert "Diameter Protocol" in spt.layers_that_may_gain("Answer In: 12", True)
    assert "Diameter Protocol" in spt.layers_that_may_gain("answer in: 12", False)
    assert "Diameter Protocol" not in spt.layers_that_may_gain("answer in: 12", True)
    assert "Transmission Control Protocol" in spt.layers_that_may_gain("    [Conversation completeness: Comp", True)
    # TCP flags are upper case
    assert "Transmission Control Protocol" not in spt.layers_that_may_gain("Complete, data", True)
    assert spt.may_contain("a(bc)+d", "cbcb", True) and not spt.may_contain("a(bc)+d", "cc", True)
    assert spt.may_contain("x{2,3}", "xxx", True) and not spt.may_contain("x{2,3}", "xxxx", True)


def test_every_shape_holds_every_part_of_the_lines_it_names(differences: Differences) -> None:
    checked = 0
    for lines in differences.plain.values():
        for layer, line in lines:
            stripped = line.strip()
            for start in range(0, len(line), 7):
                part = line[start:start + 9]
                assert layer in spt.layers_that_may_gain(part, True), (layer, stripped, part)
                checked += 1
    assert checked


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


def _tokens(texts: list[str]) -> list[tuple[int, str]]:
    """(frames holding it, token) for each word of the frames' text, fewest frames first."""
    holding = Counter[str]()
    for text in texts:
        holding.update({word.lower() for word in re.findall(r"[A-Za-z][A-Za-z0-9_-]{5,}", text)})
    return sorted((n, word) for word, n in holding.items())


async def test_a_loaded_captures_search_rules_out_frames_and_equals_the_two_pass_text(
        daemon: DaemonProcess, tmp_path: Path) -> None:
    """pcap_text_search on a loaded capture reads from sharkd only the frames a single pass does not
    rule out: its matches are, on every corpus capture, exactly the lines of `tshark -2 -V` (the
    two-pass text, computed here independently) that hold the query, for the rarest word of the
    page, a common one and a digit string; two pages (offset 0 and 100). Each search runs twice: with
    the filter sharkd counted, and with a new filter matching the same frames (`frame.len != N`, N
    new each time), whose page comes from a single pass before sharkd counts it."""
    captures = corpus()
    if not captures:
        pytest.skip(f"no real captures in {PCAPS} or {PCAPS_EXTRA}")
    ruled_out = searched = before_count = 0
    new_values = itertools.count(100000)  # a filter sharkd never counted, each time

    async def search_each(paths: list[Path]) -> None:
        nonlocal ruled_out, searched, before_count
        async with session(daemon) as call:
            for path in paths:
                two = frames(tmp_path, path, "-2")
                numbers = sorted(two)
                if len(numbers) < 40:
                    continue
                args = {"pcap_path": str(path), "decode_as": decode_as(path)}
                with trio.fail_after(300):
                    while True:  # loaded: the answer is sharkd's, exact
                        page = await call("pcap_frames_by_filter", **args, display_filter="", limit=1)
                        assert not page["_is_error"], page
                        if page.get("exact", True) and page.get("total_exact", True):
                            break
                        await trio.sleep(0.2)
                for offset in (0, 100):
                    window = numbers[offset:offset + 200]
                    if len(window) < 20:
                        continue
                    tokens = _tokens([two[n] for n in window])
                    # A new filter's search rules out by text for a literal; for a regex (the same word,
                    # escaped) its single pass gives only the frame numbers, and sharkd every text.
                    runs = [(query, display_filter, False, False) for query in {tokens[0][1], tokens[-1][1], "1"}
                            for display_filter in ("", f"frame.len != {next(new_values)}")]
                    runs.append((tokens[0][1], f"frame.len != {next(new_values)}", True, False))
                    # A new filter whose first page (of the search's frames and more) came first: the search
                    # may read its frames from the numbers that page's single pass found (CaptureWorkers).
                    runs.append((tokens[-1][1], f"frame.len != {next(new_values)}", False, True))
                    for query, display_filter, is_regex, paged in runs:
                        if paged:
                            page = await call("pcap_frames_by_filter", **args, display_filter=display_filter,
                                              limit=offset + 200)
                            assert not page["_is_error"], page
                        found = await call("pcap_text_search", **args, display_filter=display_filter,
                                           query=re.escape(query) if is_regex else query, is_regex=is_regex,
                                           limit=200, offset=offset, max_matches=1000, snippet_context_chars=0,
                                           max_bytes=2 * 2**20)
                        assert not found["_is_error"], found
                        if display_filter and (not paged or "served_by" in found):
                            # Its frames from a single pass: the total a lower bound or exact.
                            assert found["served_by"].startswith("tshark and sharkd"), (path.name, found["served_by"])
                            assert found["frames_total"] == (len(numbers) if found["total_exact"]
                                                             else found["total_at_least"]), path.name
                            assert found["frames_total"] <= len(numbers), path.name
                            before_count += 1
                        else:  # all frames (counted by the load), or a paged filter sharkd counted meanwhile: exact
                            assert found.get("total_exact", True) and found["frames_total"] == len(numbers), path.name
                        expected = [(n, line.strip()) for n in window for line in two[n].split("\n")
                                    for _ in range(line.lower().count(query))]
                        got = [(m["frame_number"], m["line"]) for m in found["matches"]]
                        if found["truncated"]:  # max_matches or max_bytes: the first matches, in order
                            expected = expected[:len(got)]
                        else:
                            assert found["frames_scanned"] == len(window), (path.name, found.get("note"))
                        assert got == expected, (path.name, offset, query, found.get("frames_ruled_out"))
                        ruled_out += found.get("frames_ruled_out", 0)
                        searched += len(window)

    # Two clients over alternate captures, side by side: most of each call is a tshark pass or a sharkd
    # load, which the other client's calls overlap.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(search_each, captures[0::2])
        nursery.start_soon(search_each, captures[1::2])
    assert searched and ruled_out, f"no frame was ruled out in {searched} frames searched"
    assert before_count, "no search of a new filter came from a single pass"
