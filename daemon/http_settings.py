"""The [http] table: where MCP over HTTP listens, and whether that address is safe to serve on.

Stdlib only (the CLI parses the config through it). The listener is off unless `listen` is set.
A bind that other hosts can reach needs TLS (bearer tokens would cross the network in clear text
otherwise) or an explicit `allow_insecure_non_loopback = true`; anything else is refused when the
config is read, so at start and on reload, with the fix in the message. `test_no_auth` (a listener
without tokens, for the MCP conformance suite) is refused on anything but a loopback address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from diagd.actors.settings import refuse, setting

LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class HttpConfig:
    listen: str = ""  # "127.0.0.1:8765", "[::1]:8765"; empty: no HTTP listener
    tls_cert: str = ""  # PEM certificate (chain) file; with tls_key, the listener speaks HTTPS
    tls_key: str = ""
    allow_insecure_non_loopback: bool = False
    # Extra Host header values accepted besides the listen address (a DNS name clients use to
    # reach a non-loopback bind); a wildcard bind without any accepts every Host.
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = setting(4 * 1024 * 1024, positive=True)
    # MCP sessions (docs/http.md): how many one token and all tokens may hold, how long one may sit
    # idle before its memory is freed, and how long a freed session's record stays revivable.
    max_sessions_per_token: int = setting(32, positive=True)
    max_sessions: int = setting(256, positive=True)
    session_idle_s: float = setting(1800.0, positive=True)
    session_keep_s: float = setting(7 * 86400.0, positive=True)
    # A test listener: MCP without a token, for the MCP conformance suite (it cannot send an
    # Authorization header). Loopback binds only; logged at start and shown by `diagd status`.
    test_no_auth: bool = False

    def __post_init__(self) -> None:
        if not self.listen:
            return
        host, _port = split_listen(self.listen)
        if self.max_sessions_per_token > self.max_sessions:
            raise refuse("http", "max_sessions_per_token", f"= {self.max_sessions_per_token} is over "
                         f"max_sessions = {self.max_sessions}", value=self.max_sessions_per_token)
        if bool(self.tls_cert) != bool(self.tls_key):
            missing = "tls_key" if self.tls_cert else "tls_cert"
            raise refuse("http", missing, "is missing: TLS needs both tls_cert and tls_key")
        if self.test_no_auth and not is_loopback(host):
            raise refuse("http", "test_no_auth", f"= true serves MCP without a token: only on a loopback address "
                         f"(127.0.0.1, [::1]), not {self.listen!r}", value=self.listen)
        if not is_loopback(host) and not self.tls and not self.allow_insecure_non_loopback:
            raise refuse("http", "listen", f"= {self.listen!r} is reachable from other hosts and no TLS is set: "
                         "set tls_cert and tls_key, bind 127.0.0.1, or set allow_insecure_non_loopback = true "
                         "(tokens then cross the network in clear text)", value=self.listen)

    @property
    def enabled(self) -> bool:
        return bool(self.listen)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]


def split_listen(listen: str) -> tuple[str, int]:
    """("127.0.0.1", 8765) from "127.0.0.1:8765", ("::1", 8765) from "[::1]:8765"; INVALID_ARGUMENT otherwise."""
    host, sep, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address without brackets: its port is ambiguous
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise refuse("http", "listen", f'= {listen!r} is not "HOST:PORT" (e.g. "127.0.0.1:8765", "[::1]:8765")',
                     value=listen)
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a DNS name: it may resolve to anything


def is_wildcard(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
