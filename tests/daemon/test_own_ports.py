"""The ports a back end is told are diagd's own (BackendConfig.own_tcp_ports), and the capture filter
that leaves them out: the HTTP listener's port as configured and as bound (port 0 is only known
then); a given filter kept in parentheses so no `or` in it can bring the port back."""

from __future__ import annotations

import pytest

from diagd.actors.capture.tools import applied_filter
from diagd.daemon import config as config_mod
from diagd.daemon.server.backends import backend_config, own_tcp_ports


def http(listen: str | None) -> config_mod.Config:
    return config_mod.parse({"http": {"listen": listen}} if listen is not None else {})


@pytest.mark.parametrize(("listen", "bound", "ports"), [
    (None, None, ()),
    ("127.0.0.1:8765", None, (8765,)),  # configured, not yet bound
    ("127.0.0.1:8765", "http://127.0.0.1:8765/mcp", (8765,)),
    ("[::1]:0", "http://[::1]:41234/mcp", (41234,)),  # port 0: the bound one only
    ("127.0.0.1:8766", "http://127.0.0.1:8765/mcp", (8765, 8766)),  # a reload moved it: both, until a restart
])
def test_own_ports_are_the_http_listeners_configured_and_bound(listen: str | None, bound: str | None,
                                                              ports: tuple[int, ...]) -> None:
    assert own_tcp_ports(http(listen), bound) == ports
    assert backend_config(http(listen), "capture", http_url=bound).own_tcp_ports == ports


def test_the_filter_dumpcap_runs_ands_the_exclusion_around_the_given_one() -> None:
    assert applied_filter("", []) == "" and applied_filter("sctp", []) == "sctp"
    assert applied_filter("", [8765]) == "not (tcp port 8765)"
    assert applied_filter("udp or tcp port 8765", [8765]) == "(udp or tcp port 8765) and not (tcp port 8765)"
    assert applied_filter("tcp", [8765, 8766]) == "(tcp) and not (tcp port 8765 or tcp port 8766)"
