"""The token file as docs/http.md describes it, checked from outside: what `diagd token add` stores
(name, creation time, id and the sha256 of the secret, computed here with hashlib), the secret's
shape (`diagd_` + 32 random bytes), the file's mode whatever was there before, which modes are
refused, damaged files, the legacy ids (format 1) with their derivation written out, `revoke`'s
answers, and when the daemon's verifier re-reads the file."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from diagd.daemon import tokens
from diagd.daemon.tokens import Token, TokenStore, Verifier
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

CREATED = "2026-12-06T08:00:00Z"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TokenStore:
    monkeypatch.setattr(utc, "iso", lambda ts=None, digits=0: CREATED)
    return TokenStore(tmp_path / "state")


def file_of(store: TokenStore) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(store.path.read_text())
    return data


def test_the_file_keeps_name_creation_time_id_and_the_secrets_sha256_only(store: TokenStore) -> None:
    first, second = store.add("laptop"), store.add("ci.runner@host-1")
    data = file_of(store)
    assert data["version"] == 2 and set(data) == {"version", "tokens"}
    entries = data["tokens"]
    assert [set(e) for e in entries] == [{"name", "sha256", "created", "id"}] * 2
    assert [(e["name"], e["sha256"], e["created"]) for e in entries] == [
        ("laptop", sha256(first), CREATED), ("ci.runner@host-1", sha256(second), CREATED)]
    assert all(re.fullmatch(r"[0-9a-f]{24}", e["id"]) for e in entries) and entries[0]["id"] != entries[1]["id"]
    assert first not in store.path.read_text() and first[len("diagd_"):] not in store.path.read_text()
    listed = store.tokens()
    assert listed == [Token("laptop", sha256(first), CREATED, entries[0]["id"]),
                      Token("ci.runner@host-1", sha256(second), CREATED, entries[1]["id"])]


def test_a_secret_is_diagd_and_32_random_bytes(store: TokenStore) -> None:
    secrets_seen = {store.add(f"t{i}") for i in range(20)}
    assert len(secrets_seen) == 20
    for secret in secrets_seen:
        assert secret.startswith("diagd_")
        raw = base64.urlsafe_b64decode(secret[len("diagd_"):] + "=")
        assert len(raw) == 32 and re.fullmatch(r"diagd_[A-Za-z0-9_-]{43}", secret)


def test_the_verifier_finds_the_token_by_its_secret_and_nothing_else(store: TokenStore) -> None:
    a, b = store.add("a"), store.add("b")
    verifier = Verifier(store.directory)
    ids = {e["name"]: e["id"] for e in file_of(store)["tokens"]}
    assert verifier.find(a) == Token("a", sha256(a), CREATED, ids["a"])
    assert verifier.find(b) == Token("b", sha256(b), CREATED, ids["b"])
    assert (verifier.name_of(a), verifier.name_of(b)) == ("a", "b")
    for wrong in ("", a[:-1], a + b, sha256(a), "diagd_", ids["a"], "\ud800", "caf\u00e9", f" {a}", f"{a}\n",
                  a.upper()):
        assert verifier.find(wrong) is None and verifier.name_of(wrong) is None


def test_every_stored_hash_is_compared_whichever_matches(store: TokenStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/http.md: tokens are compared in constant time (no early exit that would tell which one matched).
    secrets_made = [store.add(f"t{i}") for i in range(4)]
    verifier = Verifier(store.directory)
    compared: list[tuple[str, str]] = []
    real = tokens.hmac.compare_digest

    def spy(a: str, b: str) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", spy)
    for i, secret in enumerate(secrets_made):
        compared.clear()
        assert verifier.name_of(secret) == f"t{i}"
        assert compared == [(sha256(secret), sha256(s)) for s in secrets_made]
    compared.clear()
    assert verifier.find("diagd_nothing") is None and len(compared) == 4


def test_the_hash_is_sha256_of_the_utf8_secret_lone_surrogates_kept() -> None:
    assert tokens.digest("diagd_abc") == hashlib.sha256(b"diagd_abc").hexdigest()
    assert tokens.digest("caf\u00e9") == hashlib.sha256(b"caf\xc3\xa9").hexdigest()
    assert tokens.digest("a\ud800") == hashlib.sha256(b"a\xed\xa0\x80").hexdigest()


def test_a_legacy_entrys_id_is_the_documented_derivation_of_its_hash(store: TokenStore) -> None:
    # Fixed across versions: HTTP sessions stored under a derived id stay bound to it after an upgrade.
    h = sha256("diagd_legacy")
    expected = hashlib.sha256(b"diagd token id\x00" + h.encode("ascii")).hexdigest()[:24]
    assert tokens.derived_id(h) == expected and expected not in h
    store.directory.mkdir(mode=0o700)
    store.path.write_text(json.dumps({"version": 1, "tokens": [
        {"name": "old", "sha256": h, "created": "2025-01-01T00:00:00Z"},
        {"name": "null-id", "sha256": sha256("x"), "created": "2025-01-01T00:00:00Z", "id": None}]}))
    store.path.chmod(0o600)
    assert store.tokens() == [Token("old", h, "2025-01-01T00:00:00Z", expected),
                              Token("null-id", sha256("x"), "2025-01-01T00:00:00Z", tokens.derived_id(sha256("x")))]
    assert Verifier(store.directory).find("diagd_legacy") == store.tokens()[0]


def test_a_new_id_is_never_one_the_file_already_has(store: TokenStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.add("first")
    taken = file_of(store)["tokens"][0]["id"]
    drawn: list[int] = []
    queue = [taken, taken, "0a" * 12]

    def token_hex(nbytes: int) -> str:
        drawn.append(nbytes)
        return queue.pop(0)

    monkeypatch.setattr(tokens.secrets, "token_hex", token_hex)
    store.add("second")
    assert drawn == [12, 12, 12]  # 96 random bits, drawn again while taken
    assert [e["id"] for e in file_of(store)["tokens"]] == [taken, "0a" * 12]


def test_the_file_is_0600_whatever_was_left_before_and_whatever_the_umask(store: TokenStore) -> None:
    store.directory.mkdir(mode=0o700)
    leftover = store.directory / (tokens.FILE + ".tmp")  # a write interrupted by an older diagd
    leftover.write_text("junk")
    leftover.chmod(0o666)
    previous = os.umask(0)
    try:
        secret = store.add("a")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600 and not leftover.exists()
    assert Verifier(store.directory).name_of(secret) == "a"
    assert store.path.read_text().endswith("\n") and json.loads(store.path.read_text())["version"] == 2


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o610, 0o601, 0o644, 0o666])
def test_a_file_anyone_else_has_a_bit_on_is_refused(store: TokenStore, mode: int) -> None:
    secret = store.add("a")
    os.chmod(store.path, mode)
    for read in (store.tokens, lambda: Verifier(store.directory).find(secret), lambda: store.add("b"),
                 lambda: store.revoke("a")):
        with pytest.raises(DiagdError) as caught:
            read()
        assert caught.value.code is ErrorCode.PERMISSION_DENIED
        assert f"(mode {mode:04o})" in caught.value.message and str(store.path) in caught.value.message
        assert caught.value.details["path"] == str(store.path)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_an_owner_only_file_is_read(store: TokenStore, mode: int) -> None:
    secret = store.add("a")
    os.chmod(store.path, mode)
    assert Verifier(store.directory).name_of(secret) == "a"


@pytest.mark.parametrize("text", ["{broken", "[]", '{"version": 2}', '{"tokens": 5}', '{"tokens": [[1]]}',
                                  '{"tokens": [{"sha256": "ab", "created": "x"}]}',
                                  '{"tokens": [{"name": "a", "created": "x"}]}',
                                  '{"tokens": [{"name": "a", "sha256": "ab", "id": "cd"}]}',
                                  '{"tokens": [{"name": "a", "sha256": null, "created": "x"}]}',
                                  '{"tokens": [{"name": "a", "sha256": "ab", "created": "x", "id": 0}]}'])
def test_a_damaged_file_is_refused_saying_so(store: TokenStore, text: str) -> None:
    store.directory.mkdir(mode=0o700)
    store.path.write_text(text)
    store.path.chmod(0o600)
    with pytest.raises(DiagdError) as caught:
        store.tokens()
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert caught.value.message.startswith(f"token file {store.path} is damaged")
    assert caught.value.message.endswith("; remove it and add the tokens again")
    assert caught.value.details["path"] == str(store.path)
    if "null" in text or '"id": 0' in text:  # what is wrong, in the message
        assert "is damaged (TypeError(\"a token's sha256 or id is not a string\"));" in caught.value.message
    with pytest.raises(DiagdError):
        store.add("b")  # never overwritten by a write that would lose its entries
    assert store.path.read_text() == text


def test_no_file_is_no_tokens_and_the_directory_is_made_owner_only(store: TokenStore) -> None:
    assert store.tokens() == [] and not store.path.exists()
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    assert store.path == store.directory / "http_tokens.json"


@pytest.mark.parametrize("name", ["a", "Z", "7", "a" * 64, "A-b_c.d@e", "0-", "x@y.example"])
def test_plain_names_are_taken(store: TokenStore, name: str) -> None:
    assert tokens.check_name(name) == name
    store.add(name)
    assert [t.name for t in store.tokens()] == [name]


@pytest.mark.parametrize("name", ["", "a" * 65, "-a", "_a", ".a", "@a", "a b", "a/b", "a\n", "\na", "é", "a:b"])
def test_other_names_are_refused(store: TokenStore, name: str) -> None:
    with pytest.raises(DiagdError) as caught:
        store.add(name)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT and caught.value.details["name"] == name
    assert caught.value.message == (f"token name {name!r} must be 1-64 letters, digits or _.@- "
                                    "(starting with a letter or digit)")
    assert not store.path.exists()


def test_a_name_taken_is_refused_and_the_first_token_stays(store: TokenStore) -> None:
    secret = store.add("ci")
    before = store.path.read_text()
    with pytest.raises(DiagdError) as caught:
        store.add("ci")
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT and caught.value.details["name"] == "ci"
    assert "`diagd token revoke ci`" in caught.value.message
    assert store.path.read_text() == before and Verifier(store.directory).name_of(secret) == "ci"


def test_a_revoke_removes_exactly_that_token_and_answers_it(store: TokenStore) -> None:
    kept = [store.add("a"), store.add("b"), store.add("c")]
    entries = file_of(store)["tokens"]
    gone = store.revoke("b")
    assert gone == Token("b", sha256(kept[1]), CREATED, entries[1]["id"])
    assert file_of(store)["tokens"] == [entries[0], entries[2]]
    verifier = Verifier(store.directory)
    assert [verifier.name_of(s) for s in kept] == ["a", None, "c"]
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_revoking_an_unknown_name_lists_close_names_or_all_or_none(store: TokenStore) -> None:
    def refused(name: str) -> DiagdError:
        with pytest.raises(DiagdError) as caught:
            store.revoke(name)
        assert caught.value.code is ErrorCode.NOT_FOUND and caught.value.details["name"] == name
        return caught.value

    none = refused("x")
    assert none.message == "no token named 'x'; there are no tokens" and none.details["did_you_mean"] == []
    for name in ("laptop-1", "laptop-2", "laptop-3", "laptop-4", "zeta", "alpha"):
        store.add(name)
    close = refused("laptop")
    assert len(close.details["did_you_mean"]) == 3
    assert set(close.details["did_you_mean"]) <= {"laptop-1", "laptop-2", "laptop-3", "laptop-4"}
    assert close.message == f"no token named 'laptop'; did you mean {' or '.join(close.details['did_you_mean'])}?"
    far = refused("qqqqqqq")
    assert far.message == ("no token named 'qqqqqqq'; tokens: alpha, laptop-1, laptop-2, laptop-3, laptop-4, zeta")
    assert far.details["did_you_mean"] == []
    assert len(store.tokens()) == 6


def test_the_verifier_rereads_the_file_only_when_it_changed(store: TokenStore,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    secret = store.add("a")
    verifier = Verifier(store.directory)
    reads: list[int] = []
    real = verifier.store.tokens

    def counted() -> list[Token]:
        reads.append(1)
        return real()

    monkeypatch.setattr(verifier.store, "tokens", counted)
    for _ in range(5):
        assert verifier.name_of(secret) == "a"
    assert len(reads) == 1  # a stat per request, no read
    other = store.add("b")
    assert verifier.name_of(other) == "b" and len(reads) == 2
    store.path.unlink()  # no file: no token accepted, nothing to read
    assert verifier.name_of(secret) is None and verifier.name_of(other) is None and len(reads) == 2
    again = store.add("a")
    assert verifier.name_of(again) == "a" and verifier.name_of(secret) is None and len(reads) == 3


def test_an_unsafe_file_accepts_no_token_until_it_is_fixed(store: TokenStore) -> None:
    secret = store.add("a")
    verifier = Verifier(store.directory)
    assert verifier.name_of(secret) == "a"
    text = store.path.read_text()
    store.path.unlink()
    store.path.write_text(text)
    store.path.chmod(0o644)
    for _ in range(2):  # every request is refused, none with the tokens read before
        with pytest.raises(DiagdError):
            verifier.find(secret)
    store.path.unlink()
    store.path.write_text(text)
    store.path.chmod(0o600)
    assert verifier.name_of(secret) == "a"
