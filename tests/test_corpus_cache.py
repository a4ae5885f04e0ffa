"""The test corpus stands alone: tests/corpus.toml names every capture (source, commit, licence, sha256),
tests/support/corpus_cache.py puts them in the cache tests/pcaps.py reads, copied from a named folder or
fetched from their pinned sources, and refuses any file whose sha256 differs."""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests import pcaps
from tests.support import corpus_cache
from tests.support.corpus_cache import CORPORA, Capture, cached, fill, manifest


def capture(name: str, data: bytes, corpus: str = "pcaps") -> Capture:
    return Capture(name=name, corpus=corpus, repository="owner/repo", commit="0123abc", path=f"caps/{name}",
                   licence="BSD-3-Clause", sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def source_with(root: Path, files: dict[str, bytes], corpus: str = "pcaps") -> Path:
    (root / corpus).mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / corpus / name).write_bytes(data)
    return root


def test_the_manifest_names_each_capture_once_with_its_source_licence_and_sha256() -> None:
    entries = manifest()
    assert len(entries) >= 36 and len({c.name for c in entries}) == len(entries)
    for c in entries:
        assert c.corpus in CORPORA and "/" in c.repository and c.path and c.licence and c.size > 0
        assert len(c.sha256) == 64 and int(c.sha256, 16) >= 0 and int(c.commit, 16) >= 0 and len(c.commit) >= 7


def test_a_capture_url_is_its_file_at_the_pinned_commit() -> None:
    c = capture("x.pcap", b"x")
    assert c.url == "https://raw.githubusercontent.com/owner/repo/0123abc/caps/x.pcap"


def test_fill_copies_from_the_named_folder_into_each_corpus_folder(tmp_path: Path) -> None:
    a, b = capture("a.pcap", b"aaa"), capture("b.pcapng", b"bbb", corpus="pcaps-extra")
    source = source_with(source_with(tmp_path / "src", {"a.pcap": b"aaa"}), {"b.pcapng": b"bbb"}, "pcaps-extra")
    assert fill([a, b], tmp_path / "cache", source) == []
    assert (tmp_path / "cache" / "pcaps" / "a.pcap").read_bytes() == b"aaa"
    assert (tmp_path / "cache" / "pcaps-extra" / "b.pcapng").read_bytes() == b"bbb"
    assert not list((tmp_path / "cache" / ".partial").iterdir())


def test_a_file_whose_sha256_differs_is_refused_and_not_cached(tmp_path: Path) -> None:
    c = capture("a.pcap", b"the real bytes")
    source = source_with(tmp_path / "src", {"a.pcap": b"other bytes"})
    (problem,) = fill([c], tmp_path / "cache", source)
    assert problem.startswith("a.pcap: sha256 ") and problem.endswith("refused")
    assert not (tmp_path / "cache" / "pcaps" / "a.pcap").exists()


def test_a_cached_file_with_its_sha256_is_kept_and_a_changed_one_replaced(tmp_path: Path) -> None:
    good, changed = capture("good.pcap", b"good"), capture("changed.pcap", b"fresh")
    cache = source_with(tmp_path / "cache", {"good.pcap": b"good", "changed.pcap": b"stale"})
    assert cached(good, cache) and not cached(changed, cache)
    source = source_with(tmp_path / "src", {"changed.pcap": b"fresh"})  # no good.pcap there: not needed
    assert fill([good, changed], cache, source) == []
    assert (cache / "pcaps" / "changed.pcap").read_bytes() == b"fresh"


def test_a_capture_absent_from_the_named_folder_is_reported(tmp_path: Path) -> None:
    assert fill([capture("gone.pcap", b"x")], tmp_path / "cache", source_with(tmp_path / "src", {})) == [
        f"gone.pcap: not in {tmp_path / 'src' / 'pcaps'}"]


def test_without_a_folder_each_capture_is_fetched_from_its_url_and_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = {capture("a.pcap", b"aaa").url: b"aaa", capture("b.pcap", b"bbb").url: b"not b"}
    asked = []

    def urlopen(url: str, timeout: float) -> Any:
        asked.append(url)
        out = tmp_path / "served"
        out.write_bytes(served[url])
        return out.open("rb")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    problems = fill([capture("a.pcap", b"aaa"), capture("b.pcap", b"bbb")], tmp_path / "cache", None)
    assert asked == list(served) and len(problems) == 1 and problems[0].startswith("b.pcap: sha256 ")
    assert (tmp_path / "cache" / "pcaps" / "a.pcap").read_bytes() == b"aaa"


def test_an_unreachable_source_names_the_url_and_the_way_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def urlopen(url: str, timeout: float) -> Any:
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    c = capture("a.pcap", b"a")
    (problem,) = fill([c], tmp_path / "cache", None)
    assert c.url in problem and "DIAGD_TEST_CAPTURES" in problem


def test_the_cache_folder_follows_its_variable_then_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DIAGD_TEST_CAPTURES_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert corpus_cache.cache_dir() == tmp_path / "xdg" / "diagd" / "test-captures"
    monkeypatch.setenv("DIAGD_TEST_CAPTURES_CACHE", str(tmp_path / "mine"))
    assert corpus_cache.cache_dir() == tmp_path / "mine"


def test_the_tests_read_the_cache_unless_a_folder_is_named() -> None:
    named = os.environ.get("DIAGD_TEST_PCAPS")
    expected = Path(named) if named else corpus_cache.cache_dir() / "pcaps"
    assert expected == pcaps.PCAPS
    if not named and not os.environ.get("DIAGD_TEST_PCAPS_EXTRA"):
        assert corpus_cache.cache_dir() / "pcaps-extra" == pcaps.PCAPS_EXTRA


def test_the_command_line_fills_from_a_folder_and_then_checks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "corpus.toml").write_text(
        '[[capture]]\nname = "a.pcap"\ncorpus = "pcaps"\nrepository = "o/r"\ncommit = "0123abc"\npath = "a.pcap"\n'
        f'licence = "MIT"\nsha256 = "{hashlib.sha256(b"aaa").hexdigest()}"\nsize = 3\n')
    monkeypatch.setattr(corpus_cache, "MANIFEST", tmp_path / "corpus.toml")
    monkeypatch.setenv("DIAGD_TEST_CAPTURES_CACHE", str(tmp_path / "cache"))
    assert corpus_cache.main(["check"]) == 1
    source = source_with(tmp_path / "src", {"a.pcap": b"aaa"})
    assert corpus_cache.main(["fill", "--from", str(source)]) == 0
    assert "1 of 1 captures" in capsys.readouterr().out
    assert corpus_cache.main(["check"]) == 0
    assert corpus_cache.main(["fill", "--from", str(tmp_path / "nowhere")]) == 2
