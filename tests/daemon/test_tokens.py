"""Bearer tokens for MCP over HTTP: shown once, stored as a hash in an owner-only file, revoked by
name, and seen by a running verifier without a restart."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from diagd.daemon import tokens
from diagd.daemon.cli import token_cli
from diagd.daemon.tokens import TokenStore, Verifier
from diagd.protocol.errors import DiagdError, ErrorCode


def test_a_new_token_is_accepted_by_name_and_only_its_hash_is_stored(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    secret = store.add("laptop")
    assert secret.startswith(tokens.PREFIX) and len(secret) > 40
    text = store.path.read_text()
    assert secret not in text and tokens.digest(secret) in text
    assert Verifier(store.directory).name_of(secret) == "laptop"
    assert Verifier(store.directory).name_of(secret + "x") is None


def test_the_token_file_is_owner_only(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    store.add("a")
    store.add("b")
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700


def test_a_revoke_is_seen_by_a_running_verifier(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    keep, drop = store.add("keep"), store.add("drop")
    verifier = Verifier(store.directory)
    assert verifier.name_of(drop) == "drop"
    store.revoke("drop")
    assert verifier.name_of(drop) is None
    assert verifier.name_of(keep) == "keep"


def test_revoking_an_unknown_name_says_which_names_are_close(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    store.add("laptop")
    with pytest.raises(DiagdError) as caught:
        store.revoke("laptp")
    assert caught.value.code is ErrorCode.NOT_FOUND and caught.value.details["did_you_mean"] == ["laptop"]


def test_a_name_is_added_once_and_must_be_plain(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    store.add("ci")
    for bad in ("ci", "", "a b", "../x", "x" * 65):
        with pytest.raises(DiagdError) as caught:
            store.add(bad)
        assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    secret = store.add("a")
    os.chmod(store.path, 0o644)
    with pytest.raises(DiagdError) as caught:
        Verifier(store.directory).name_of(secret)
    assert caught.value.code is ErrorCode.PERMISSION_DENIED


def test_a_symlinked_token_file_is_refused(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    store.add("a")
    elsewhere = tmp_path / "elsewhere.json"
    store.path.rename(elsewhere)
    store.path.symlink_to(elsewhere)
    with pytest.raises(DiagdError) as caught:
        store.tokens()
    assert caught.value.code is ErrorCode.PERMISSION_DENIED


def test_no_token_file_accepts_no_token(tmp_path: Path) -> None:
    assert Verifier(tmp_path / "state").name_of("diagd_anything") is None


def test_the_listing_never_shows_a_secret_or_its_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = TokenStore(tmp_path / "state")
    assert token_cli.run("add", "ci", store=store) == 0
    secret = capsys.readouterr().out.strip()
    for as_json in (False, True):
        assert token_cli.run("list", None, as_json=as_json, store=store) == 0
        out = capsys.readouterr().out
        assert "ci" in out and secret not in out and tokens.digest(secret) not in out
    assert json.loads(out)["tokens"][0]["name"] == "ci"


def test_the_token_commands_load_neither_trio_nor_mcp() -> None:
    probe = ("import sys\nfrom diagd.daemon.cli import cli\nimport diagd.daemon.cli.token_cli\n"
             "print(' '.join(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert not {m.split(".")[0] for m in done.stdout.split()} & {"trio", "mcp", "anyio", "hypercorn"}


def test_each_token_has_an_id_of_its_own_and_a_name_added_again_is_a_new_token(tmp_path: Path) -> None:
    # Issue 39: HTTP sessions are bound to the id, so a revoked token's sessions never pass to its successor.
    store = TokenStore(tmp_path / "state")
    first = store.add("laptop")
    verifier = Verifier(store.directory)
    old = verifier.find(first)
    assert old is not None and old.name == "laptop" and len(old.id) == 24
    assert Verifier(store.directory).find(first) == old  # the same on every read
    store.revoke("laptop")
    second = store.add("laptop")
    new = verifier.find(second)
    assert verifier.find(first) is None
    assert new is not None and new.name == "laptop" and new.id != old.id
    assert json.loads(store.path.read_text())["version"] == tokens.FORMAT_VERSION == 2


def test_a_token_file_written_before_ids_is_read_with_a_derived_id_that_a_rewrite_keeps(tmp_path: Path) -> None:
    store = TokenStore(tmp_path / "state")
    secret = store.add("old")
    data = json.loads(store.path.read_text())
    data = {"version": 1, "tokens": [{k: v for k, v in e.items() if k != "id"} for e in data["tokens"]]}
    store.path.write_text(json.dumps(data))
    store.path.chmod(0o600)
    legacy = Verifier(store.directory).find(secret)
    assert legacy is not None and legacy.id == tokens.derived_id(tokens.digest(secret)) != tokens.digest(secret)
    assert Verifier(store.directory).find(secret) == legacy
    store.add("new")  # the next write stores every id, the derived one as it was read
    stored = {e["name"]: e["id"] for e in json.loads(store.path.read_text())["tokens"]}
    assert stored["old"] == legacy.id and stored["new"] != legacy.id
    assert Verifier(store.directory).find(secret) == legacy


@pytest.mark.parametrize("entry", [{"id": 7}, {"id": ""}, {"sha256": 5}])
def test_a_token_entry_with_a_bad_id_or_hash_is_a_damaged_file(tmp_path: Path, entry: dict[str, object]) -> None:
    store = TokenStore(tmp_path / "state")
    store.add("a")
    data = json.loads(store.path.read_text())
    data["tokens"][0].update(entry)
    store.path.write_text(json.dumps(data))
    with pytest.raises(DiagdError) as caught:
        store.tokens()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT and "damaged" in caught.value.message
