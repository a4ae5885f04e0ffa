"""`diagd examples`: the sample captures shipped with diagd, listed with what they show and their licence,
copied with their NOTICE and licence texts, never over a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagd import samples
from diagd.daemon.cli import cli


def test_the_listing_names_every_sample_with_its_size_licence_and_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["examples"]) == 0
    out = capsys.readouterr().out
    for s in samples.SAMPLES:
        line = next(line for line in out.splitlines() if line.startswith(s.name))
        assert s.licence in line and s.shows in line
    assert str(samples.FOLDER) in out and "--copy DIR" in out


def test_the_json_listing_gives_each_sample_its_installed_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["examples", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in listed["samples"]] == [s.name for s in samples.SAMPLES]
    for row in listed["samples"]:
        assert Path(row["path"]).stat().st_size == row["size"] > 0
        assert row["licence"] in ("Apache-2.0", "BSD-3-Clause") and row["source"]
    assert Path(listed["notice"]).read_text().count("sha256:") == len(samples.SAMPLES)


def test_copy_makes_the_folder_and_copies_the_samples_notice_and_licences_byte_for_byte(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "new" / "samples"
    assert cli.main(["examples", "--copy", str(target), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in target.iterdir()) == sorted(samples.files())
    assert done["captures"] == [str(target / s.name) for s in samples.SAMPLES]
    for name in samples.files():
        assert (target / name).read_bytes() == (samples.FOLDER / name).read_bytes()


def test_copy_refuses_a_folder_holding_any_of_the_files_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "NOTICE").write_text("mine")
    assert cli.main(["examples", "--copy", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("diagd examples: INVALID_ARGUMENT: ") and "NOTICE" in err and "never overwrites" in err
    assert [p.name for p in tmp_path.iterdir()] == ["NOTICE"] and (tmp_path / "NOTICE").read_text() == "mine"


def test_copy_into_a_folder_it_cannot_write_is_a_coded_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    assert cli.main(["examples", "--copy", str(tmp_path / "file" / "under")]) == 1
    assert capsys.readouterr().err.startswith("diagd examples: PERMISSION_DENIED: cannot copy into ")
