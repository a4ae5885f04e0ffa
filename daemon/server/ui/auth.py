"""Who may see the web view (/ui): one-time login links and the browser sessions they open.

The Jupyter way: `diagd ui` asks the daemon (control socket) for a login link; the daemon mints a
one-time secret, keeps only its sha256 with an expiry (`ONCE_TTL_S`), and the link
`/ui/login?once=<secret>` exchanges it, once, for a session: a second random secret the browser keeps
in an HttpOnly, SameSite=Strict cookie scoped to /ui (web.py sets it). Sessions live in the
daemon's memory only (a restart logs the browser out; `diagd ui` again logs it in), at most
`MAX_SESSIONS` (the oldest goes), each for `SESSION_TTL_S`. Every presented secret is compared with
every stored hash in constant time, without an early exit.

Stdlib only: the daemon makes one of these at start whether or not HTTP is served.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

ONCE_TTL_S = 120.0  # a login link is good for two minutes, and once
MAX_PENDING = 16  # unused login links kept at most (the oldest is forgotten)
SESSION_TTL_S = 12 * 3600.0  # a browser session; the cookie's Max-Age too
MAX_SESSIONS = 32  # browser sessions kept at most (the oldest is logged out)
COOKIE = "diagd_ui"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class _Secrets:
    """Hashes of live secrets with their expiry (monotonic seconds), bounded, oldest first."""

    def __init__(self, limit: int, clock: Callable[[], float]) -> None:
        self._expiry: dict[str, float] = {}
        self._limit = limit
        self._clock = clock

    def mint(self, ttl_s: float) -> str:
        self._forget_expired()
        while len(self._expiry) >= self._limit:
            del self._expiry[next(iter(self._expiry))]
        secret = secrets.token_urlsafe(32)
        self._expiry[_digest(secret)] = self._clock() + ttl_s
        return secret

    def find(self, presented: str) -> str | None:
        """The stored hash `presented` is, if it has not expired. Every entry is compared."""
        self._forget_expired()
        digest = _digest(presented)
        found = None
        for stored in self._expiry:  # no early exit: the time taken does not say which entry matched
            if hmac.compare_digest(digest, stored):
                found = stored
        return found

    def drop(self, stored: str) -> None:
        self._expiry.pop(stored, None)

    def __len__(self) -> int:
        self._forget_expired()
        return len(self._expiry)

    def _forget_expired(self) -> None:
        now = self._clock()
        for stored in [s for s, until in self._expiry.items() if until <= now]:
            del self._expiry[stored]


class UiAuth:
    """The daemon's login links and browser sessions for /ui."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._once = _Secrets(MAX_PENDING, clock)
        self._sessions = _Secrets(MAX_SESSIONS, clock)

    def login_secret(self) -> str:
        """A new one-time secret for a login link (`diagd ui`)."""
        return self._once.mint(ONCE_TTL_S)

    def redeem(self, once: str) -> str | None:
        """A new session's secret for a valid, unused, unexpired one-time secret (used up now), else None."""
        stored = self._once.find(once)
        if stored is None:
            return None
        self._once.drop(stored)
        return self._sessions.mint(SESSION_TTL_S)

    def session_ok(self, secret: str) -> bool:
        return self._sessions.find(secret) is not None

    def pending(self) -> int:
        return len(self._once)

    def sessions(self) -> int:
        return len(self._sessions)
