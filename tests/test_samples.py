"""The captures diagd ships (diagd/samples/) may be shipped: each is the test corpus' file of that name
byte for byte (tests/corpus.toml names its source and sha256), under a licence that allows
redistribution, named with its source, commit and sha256 in the NOTICE beside it, its licence text there."""

from __future__ import annotations

import fnmatch
import hashlib
import tomllib

from diagd import samples
from tests.support.corpus_cache import MANIFEST, manifest

PERMISSIVE = {"Apache-2.0", "BSD-3-Clause"}  # the corpus' other licences (AGPL, OAI PL, none stated) may not ship
PACKAGE_DATA = tomllib.loads((MANIFEST.parent.parent / "pyproject.toml").read_text()
                             )["tool"]["setuptools"]["package-data"]["diagd.samples"]


def test_every_sample_is_a_corpus_capture_byte_for_byte_under_a_licence_that_allows_shipping_it() -> None:
    corpus = {c.name: c for c in manifest()}
    assert len(samples.SAMPLES) >= 3
    for s in samples.SAMPLES:
        entry = corpus[s.name]
        assert hashlib.sha256(s.path.read_bytes()).hexdigest() == entry.sha256
        assert s.licence == entry.licence in PERMISSIVE
        assert s.source == f"{entry.repository}:{entry.path} @{entry.commit}"


def test_the_notice_names_each_sample_source_commit_licence_and_sha256() -> None:
    notice = (samples.FOLDER / samples.NOTICE).read_text()
    corpus = {c.name: c for c in manifest()}
    for s in samples.SAMPLES:
        block = notice.split(f"\n{s.name}\n", 1)[1].split("\n\n", 1)[0]
        entry = corpus[s.name]
        assert f"github.com/{entry.repository}" in block and entry.commit in block
        assert entry.sha256 in block and s.licence_file in block
        assert " ".join(entry.path.split()) in " ".join(block.split())


def test_each_licence_text_is_there_and_magma_keeps_its_copyright_notice() -> None:
    for name in {s.licence_file for s in samples.SAMPLES}:
        assert (samples.FOLDER / name).stat().st_size > 1000
    bsd = (samples.FOLDER / "LICENSE.BSD-3-Clause").read_text()
    assert "Copyright (c) 2020, The Magma Authors" in bsd and "Redistributions in binary form" in bsd
    assert "Apache License" in (samples.FOLDER / "LICENSE.Apache-2.0").read_text()


def test_the_folder_holds_only_what_ships_and_package_data_takes_all_of_it() -> None:
    present = sorted(p.name for p in samples.FOLDER.iterdir() if p.is_file() and p.suffix not in (".py", ".pyc"))
    assert present == sorted(samples.files())
    assert all(any(fnmatch.fnmatch(n, pattern) for pattern in PACKAGE_DATA) for n in present)
