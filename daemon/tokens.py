"""Bearer tokens for MCP over HTTP: `diagd token add/list/revoke`, and the daemon's check.

Stdlib only: the token commands run without a daemon and must start fast. A token is shown once,
when it is made; the file keeps only its sha256 (a 32-byte random secret needs no slow hash: there
is nothing to guess). Each token also has an id of its own, random, made with it: HTTP sessions are
bound to that id, never to the name, so a revoked token's sessions stay refused when the name is
added again (issue 39); entries written before ids existed (version 1) get one derived from their
hash, the same on every read. The file lives in the checked owner-only state directory, is written
whole (temporary file, then rename, under a lock) with mode 0600 and never through a symlink, and is
refused when anyone else could read it. The daemon re-reads it when it changes, so a revoke
applies to the next request without a restart.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.daemon import paths
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

FILE = "http_tokens.json"
LOCK = "http_tokens.lock"
PREFIX = "diagd_"  # makes a leaked token recognisable (secret scanners, logs)
FORMAT_VERSION = 2  # 2: each entry has its "id" (version 1 entries, without one, get a derived id)
_ID_BYTES = 12
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


@dataclass(frozen=True)
class Token:
    name: str
    sha256: str
    created: str
    id: str  # immutable: made with the secret, never reused; what HTTP sessions are bound to


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def derived_id(sha256: str) -> str:
    """The id of a token stored before ids existed: fixed by its hash (one-way, and apart from it)."""
    return hashlib.sha256(b"diagd token id\0" + sha256.encode()).hexdigest()[:2 * _ID_BYTES]


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"token name {name!r} must be 1-64 letters, digits or _.@- "
                         "(starting with a letter or digit)", name=name)
    return name


class TokenStore:
    """The token file in a checked private directory (default: the state directory)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or paths.state_dir()

    @property
    def path(self) -> Path:
        return self.directory / FILE

    def tokens(self) -> list[Token]:
        with self._dir() as d:
            return list(_read(d).values())

    def add(self, name: str) -> str:
        """Make a token called `name`; returns its secret (the only time anyone sees it)."""
        check_name(name)
        secret = PREFIX + secrets.token_urlsafe(32)
        with self._dir() as d, _locked(d):
            tokens = _read(d)
            if name in tokens:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"a token named {name!r} exists; revoke it first "
                                 f"(`diagd token revoke {name}`) or pick another name", name=name)
            taken = {t.id for t in tokens.values()}
            token_id = secrets.token_hex(_ID_BYTES)
            while token_id in taken:  # 96 random bits: never in practice
                token_id = secrets.token_hex(_ID_BYTES)
            tokens[name] = Token(name, digest(secret), utc.iso(), token_id)
            _write(d, tokens)
        return secret

    def revoke(self, name: str) -> Token:
        with self._dir() as d, _locked(d):
            tokens = _read(d)
            gone = tokens.pop(name, None)
            if gone is None:
                close = difflib.get_close_matches(name, list(tokens), n=3)
                hint = f"; did you mean {' or '.join(close)}?" if close else (
                    f"; tokens: {', '.join(sorted(tokens))}" if tokens else "; there are no tokens")
                raise DiagdError(ErrorCode.NOT_FOUND, f"no token named {name!r}{hint}", name=name,
                                 did_you_mean=close)
            _write(d, tokens)
        return gone

    @contextmanager
    def _dir(self) -> Iterator[paths.PrivateDir]:
        d = paths.open_private_dir(self.directory, what="state directory")
        try:
            yield d
        finally:
            d.close()


class Verifier:
    """The daemon's view of the token file: re-read when it changes (checked by a stat per request,
    which costs microseconds; a revoke then needs no restart and no signal)."""

    def __init__(self, directory: Path) -> None:
        self.store = TokenStore(directory)
        self._seen: tuple[int, int, int, int] | None = None
        self._tokens: list[Token] = []

    def find(self, secret: str) -> Token | None:
        """The token `secret` is, or None. Compares every stored hash in constant time."""
        self._refresh()
        presented = digest(secret)
        found = None
        for token in self._tokens:  # no early exit: the time taken does not say which entry matched
            if hmac.compare_digest(presented, token.sha256):
                found = token
        return found

    def name_of(self, secret: str) -> str | None:
        token = self.find(secret)
        return None if token is None else token.name

    def _refresh(self) -> None:
        try:
            st = os.stat(self.store.path)
            seen = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            seen = None
        if seen is not None and seen == self._seen:
            return
        # An unreadable or unsafe file accepts no token (fail closed); the caller logs the error.
        self._tokens = []
        if seen is not None:
            self._tokens = self.store.tokens()
        self._seen = seen


@contextmanager
def _locked(d: paths.PrivateDir) -> Iterator[None]:
    """Serialise writers (two `diagd token add` at once would lose one)."""
    fd = d.open(LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(d: paths.PrivateDir) -> dict[str, Token]:
    try:
        fd = d.open(FILE, os.O_RDONLY)
    except DiagdError as exc:
        if not os.path.lexists(d.path / FILE):
            return {}
        raise exc
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"refusing token file {d.path / FILE}: others may read it "
                             f"(mode {mode:04o}); revoke every token and remove it", path=str(d.path / FILE))
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read()
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
        entries: list[dict[str, Any]] = data["tokens"]
        return {e["name"]: _entry(e) for e in entries}
    except (ValueError, KeyError, TypeError) as exc:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"token file {d.path / FILE} is damaged ({exc!r}); "
                         "remove it and add the tokens again", path=str(d.path / FILE)) from None


def _entry(e: dict[str, Any]) -> Token:
    sha256, token_id = e["sha256"], e.get("id")  # no id: written by a version before ids (format 1)
    if not isinstance(sha256, str) or not isinstance(token_id, str | None) or token_id == "":
        raise TypeError("a token's sha256 or id is not a string")
    return Token(e["name"], sha256, e["created"], token_id or derived_id(sha256))


def _write(d: paths.PrivateDir, tokens: dict[str, Token]) -> None:
    data = {"version": FORMAT_VERSION,
            "tokens": [{"name": t.name, "sha256": t.sha256, "created": t.created, "id": t.id}
                       for t in tokens.values()]}
    tmp = FILE + ".tmp"
    fd = d.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode only applies to a new file
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write((json.dumps(data, indent=1) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, FILE, src_dir_fd=d.fd, dst_dir_fd=d.fd)  # readers see the old file or the new, never half
