"""The test corpus' cache: the captures tests/corpus.toml names, put where tests/pcaps.py reads them.

    python -m tests.support.corpus_cache fill [--from DIR]   copy from DIR (default: $DIAGD_TEST_CAPTURES),
                                                             else fetch each file from its pinned source
    python -m tests.support.corpus_cache check               is every file there, with its sha256?
    python -m tests.support.corpus_cache where               print the cache folder

DIR holds `pcaps/` and `pcaps-extra/` (the two corpora, as the manifest's `corpus` says). The cache is
`$DIAGD_TEST_CAPTURES_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/diagd/test-captures`, with the same two
folders. Every file's sha256 is checked before it lands there: a file that differs is refused, never
cached. A file already cached with the right sha256 is kept (so `fill` is quick the second time).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).resolve().parent.parent / "corpus.toml"
CORPORA = ("pcaps", "pcaps-extra")
FETCH_TIMEOUT_S = 60.0
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class Capture:
    name: str
    corpus: str
    repository: str
    commit: str
    path: str
    licence: str
    sha256: str
    size: int

    @property
    def url(self) -> str:
        """The file at its pinned commit (raw.githubusercontent.com resolves abbreviated commits too)."""
        return f"https://raw.githubusercontent.com/{self.repository}/{self.commit}/{self.path}"


class CorpusError(Exception):
    """A capture that could not be cached: absent from the source, unreachable, or not the named bytes."""


def manifest(path: Path | None = None) -> list[Capture]:
    return [Capture(**entry) for entry in tomllib.loads((path or MANIFEST).read_text())["capture"]]


def cache_dir() -> Path:
    if override := os.environ.get("DIAGD_TEST_CAPTURES_CACHE"):
        return Path(override).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "diagd" / "test-captures"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cached(capture: Capture, cache: Path) -> bool:
    path = cache / capture.corpus / capture.name
    return path.is_file() and path.stat().st_size == capture.size and sha256_of(path) == capture.sha256


def _copy_from(capture: Capture, source: Path, into: Path) -> None:
    origin = source / capture.corpus / capture.name
    if not origin.is_file():
        raise CorpusError(f"{capture.name}: not in {origin.parent}")
    shutil.copyfile(origin, into)


def _fetch(capture: Capture, into: Path) -> None:
    try:
        with urllib.request.urlopen(capture.url, timeout=FETCH_TIMEOUT_S) as answer, into.open("wb") as out:
            shutil.copyfileobj(answer, out)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise CorpusError(f"{capture.name}: cannot fetch {capture.url}: {reason} (no network? name a folder "
                          "that holds the corpus with DIAGD_TEST_CAPTURES or --from)") from None


def put(capture: Capture, cache: Path, source: Path | None) -> None:
    """Copy (from `source`) or fetch one capture into the cache, checked: CorpusError when it cannot be."""
    folder = cache / capture.corpus
    folder.mkdir(parents=True, exist_ok=True)
    partial = cache / ".partial"  # outside the corpus folders: tests glob them for every capture
    partial.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=partial) as tmp:
        into = Path(tmp) / capture.name
        if source is not None:
            _copy_from(capture, source, into)
        else:
            _fetch(capture, into)
        got = sha256_of(into)
        if got != capture.sha256:
            raise CorpusError(f"{capture.name}: sha256 {got} is not the manifest's {capture.sha256}: refused")
        os.replace(into, folder / capture.name)


def fill(captures: Iterable[Capture], cache: Path, source: Path | None) -> list[str]:
    """Put every capture not cached yet; the problems, one line each (empty: the cache is complete)."""
    problems = []
    for capture in captures:
        if cached(capture, cache):
            continue
        try:
            put(capture, cache, source)
        except CorpusError as exc:
            problems.append(str(exc))
    return problems


def _source(given: str | None) -> Path | None:
    raw = given or os.environ.get("DIAGD_TEST_CAPTURES")
    return Path(raw).expanduser() if raw else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.corpus_cache",
                                description="the test corpus (tests/corpus.toml) in its cache, every sha256 checked")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("fill", help="copy or fetch the captures not cached yet")
    s.add_argument("--from", dest="source", metavar="DIR",
                   help="a folder holding pcaps/ and pcaps-extra/ (default: $DIAGD_TEST_CAPTURES; none: fetch "
                        "each file from its pinned source)")
    sub.add_parser("check", help="is every capture cached, with its sha256?")
    sub.add_parser("where", help="print the cache folder")
    args = p.parse_args(argv)
    cache, captures = cache_dir(), manifest()
    if args.command == "where":
        print(cache)
        return EXIT_OK
    if args.command == "check":
        missing = [c.name for c in captures if not cached(c, cache)]
        for name in missing:
            sys.stderr.write(f"corpus: {name} is not in {cache} (or differs)\n")
        return EXIT_FAILED if missing else EXIT_OK
    source = _source(args.source)
    if source is not None and not source.is_dir():
        sys.stderr.write(f"corpus: {source} is not a folder (it should hold {' and '.join(CORPORA)})\n")
        return EXIT_USAGE
    problems = fill(captures, cache, source)
    for line in problems:
        sys.stderr.write(f"corpus: {line}\n")
    print(f"corpus: {len(captures) - len(problems)} of {len(captures)} captures in {cache}"
          f" ({'copied from ' + str(source) if source else 'fetched from their pinned sources'} where missing)")
    return EXIT_FAILED if problems else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
