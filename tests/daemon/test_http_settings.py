"""The [http] table: off by default, loopback by default, and a bind other hosts can reach refused
without TLS or an explicit override, with the fix in the message."""

from __future__ import annotations

import pytest

from diagd.daemon import config
from diagd.daemon.http_settings import split_listen
from diagd.protocol.errors import DiagdError, ErrorCode


def parse(http: dict[str, object]) -> config.Config:
    return config.parse({"http": http})


def test_http_is_off_without_a_listen_address() -> None:
    assert not config.parse({}).http.enabled
    assert "http" not in config.parse({"http": {}}).backends


@pytest.mark.parametrize(("listen", "host", "port"), [("127.0.0.1:8765", "127.0.0.1", 8765),
                                                       ("[::1]:80", "::1", 80), ("localhost:0", "localhost", 0)])
def test_listen_addresses_split_into_host_and_port(listen: str, host: str, port: int) -> None:
    assert split_listen(listen) == (host, port)


@pytest.mark.parametrize("listen", ["8765", "127.0.0.1", "::1:80", "host:http", "127.0.0.1:70000"])
def test_a_malformed_listen_address_is_refused(listen: str) -> None:
    with pytest.raises(DiagdError) as caught:
        parse({"listen": listen})
    assert caught.value.details["setting"] == "[http] listen"


@pytest.mark.parametrize("listen", ["0.0.0.0:8765", "192.0.2.7:8765", "[::]:8765", "example.com:8765"])
def test_a_non_loopback_bind_without_tls_is_refused_naming_the_fix(listen: str) -> None:
    with pytest.raises(DiagdError) as caught:
        parse({"listen": listen})
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    assert "tls_cert and tls_key" in caught.value.message and "allow_insecure_non_loopback" in caught.value.message


def test_a_non_loopback_bind_is_accepted_with_tls_or_the_override() -> None:
    assert parse({"listen": "0.0.0.0:8765", "tls_cert": "/c.pem", "tls_key": "/k.pem"}).http.tls
    assert parse({"listen": "0.0.0.0:8765", "allow_insecure_non_loopback": True}).http.enabled


def test_tls_needs_both_files() -> None:
    with pytest.raises(DiagdError) as caught:
        parse({"listen": "127.0.0.1:8765", "tls_cert": "/c.pem"})
    assert caught.value.details["setting"] == "[http] tls_key"


def test_an_unknown_http_setting_is_refused_with_close_matches() -> None:
    with pytest.raises(DiagdError) as caught:
        parse({"listn": "127.0.0.1:1"})
    assert "listen" in caught.value.details["did_you_mean"]


def test_a_reload_says_http_changes_wait_for_a_restart() -> None:
    from diagd.daemon.server import reload

    notes = reload.static_notes(config.parse({}), parse({"listen": "127.0.0.1:8765"}))
    assert [n["applies_to"] for n in notes if n["setting"] == "[http] listen"] == ["the next daemon start"]
    assert "[http] listen" in reload.changed_keys(config.parse({}), parse({"listen": "127.0.0.1:8765"}))


def test_session_caps_and_times_have_sound_defaults_and_checks() -> None:
    http = parse({"listen": "127.0.0.1:8765"}).http
    assert (http.max_sessions_per_token, http.max_sessions, http.session_idle_s) == (32, 256, 1800.0)
    assert http.session_keep_s == 7 * 86400
    for key, value in (("max_sessions", 0), ("session_idle_s", 0), ("max_sessions_per_token", -1)):
        with pytest.raises(DiagdError) as caught:
            parse({"listen": "127.0.0.1:8765", key: value})
        assert caught.value.details["setting"] == f"[http] {key}"
    with pytest.raises(DiagdError) as caught:
        parse({"listen": "127.0.0.1:8765", "max_sessions_per_token": 300})
    assert caught.value.details["setting"] == "[http] max_sessions_per_token"
    assert "max_sessions = 256" in caught.value.message


@pytest.mark.parametrize("listen", ["0.0.0.0:8765", "192.0.2.7:8765", "[::]:8765", "example.com:8765"])
def test_the_tokenless_test_listener_is_refused_anywhere_but_loopback_even_with_tls_or_the_override(
        listen: str) -> None:
    for extra in ({}, {"allow_insecure_non_loopback": True}, {"tls_cert": "/c.pem", "tls_key": "/k.pem"}):
        with pytest.raises(DiagdError) as caught:
            parse({"listen": listen, "test_no_auth": True, **extra})
        assert caught.value.details["setting"] == "[http] test_no_auth" and "loopback" in caught.value.message


@pytest.mark.parametrize("listen", ["127.0.0.1:8765", "[::1]:8765", "localhost:0"])
def test_the_tokenless_test_listener_is_accepted_on_loopback_and_off_by_default(listen: str) -> None:
    assert parse({"listen": listen, "test_no_auth": True}).http.test_no_auth
    assert not parse({"listen": listen}).http.test_no_auth
