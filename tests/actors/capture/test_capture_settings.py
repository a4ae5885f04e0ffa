"""The `[capture]` table (settings.py) against docs/capture.md: the interface allow-list (names or globs,
"eth1" and "veth*"; empty: capturing is off), the documented defaults and bounds, dumpcap's command line
(the sandbox as root, refused unconfined unless allowed), its stop steps and `diagd reload`'s note.

Every expectation is written from the documented rule, case by case: an allowed name is matched whole and
with case (Linux interface names are case-sensitive bytes), a glob is a shell glob (`*` any run, also
none, `?` one character, `[...]` a set), anchored at both ends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest

from diagd.actors import sandbox, system
from diagd.actors.capture import settings as capture_settings
from diagd.actors.capture.settings import CaptureSettings, check_reload, dumpcap_policy
from diagd.actors.runtime import BackendConfig
from diagd.protocol.errors import DiagdError, ErrorCode

DOC_EXAMPLE = ("eth1", "veth*")  # docs/capture.md's own example

# (allowed_interfaces, interface, allowed?): from the documented rule, never from the module.
CASES = [
    # a plain name: itself only, whole, with its case
    (DOC_EXAMPLE, "eth1", True),
    (DOC_EXAMPLE, "eth10", False),  # not a prefix
    (DOC_EXAMPLE, "eth", False),
    (DOC_EXAMPLE, "eth1.100", False),  # its VLAN is another interface
    (DOC_EXAMPLE, "Eth1", False),
    (DOC_EXAMPLE, "ETH1", False),
    (DOC_EXAMPLE, " eth1", False),
    (DOC_EXAMPLE, "eth1 ", False),
    (DOC_EXAMPLE, "", False),
    (DOC_EXAMPLE, "eth0", False),
    (DOC_EXAMPLE, "lo", False),
    (DOC_EXAMPLE, "any", False),
    # "veth*": anchored at the start, `*` any run (also none) of any characters
    (DOC_EXAMPLE, "veth", True),
    (DOC_EXAMPLE, "veth0", True),
    (DOC_EXAMPLE, "vethA1b2c3", True),
    (DOC_EXAMPLE, "veth.100", True),
    (DOC_EXAMPLE, "veth-x_y", True),
    (DOC_EXAMPLE, "veth@if3", True),
    (DOC_EXAMPLE, "veth[0]", True),
    (DOC_EXAMPLE, "xveth0", False),
    (DOC_EXAMPLE, "VETH0", False),
    (DOC_EXAMPLE, "Veth0", False),
    (DOC_EXAMPLE, "vet", False),
    (DOC_EXAMPLE, "ve*", False),
    # a client's name is a name, not a pattern
    (("eth1",), "eth*", False),
    (("eth1",), "eth?", False),
    (("eth*",), "eth*", True),  # the literal name "eth*" is one "eth*" matches
    # `?` exactly one character
    (("eth?",), "eth0", True),
    (("eth?",), "ethX", True),
    (("eth?",), "eth", False),
    (("eth?",), "eth10", False),
    # `[...]` a set or range, `[!...]` its complement; brackets are no literal characters
    (("eth[0-2]",), "eth0", True),
    (("eth[0-2]",), "eth2", True),
    (("eth[0-2]",), "eth3", False),
    (("eth[0-2]",), "eth[0-2]", False),
    (("eth[0-2]",), "eth", False),
    (("en[!o]*",), "enp3s0", True),
    (("en[!o]*",), "eno1", False),
    (("en[!o]*",), "en", False),
    # `.`, `-`, `+` are plain characters in a glob (no regular expression)
    (("br-*",), "br-1a2b", True),
    (("br-*",), "br1a2b", False),
    (("eth0.1*",), "eth0.100", True),
    (("eth0.1*",), "eth0x100", False),
    (("a+b",), "a+b", True),
    (("a+b",), "aab", False),
    (("wg.",), "wgx", False),
    # several patterns: any one of them allows
    (("lo", "eth*", "tun?"), "tun0", True),
    (("lo", "eth*", "tun?"), "eth7", True),
    (("lo", "eth*", "tun?"), "lo", True),
    (("lo", "eth*", "tun?"), "tun10", False),
    (("lo", "eth*", "tun?"), "lo0", False),
    # everything
    (("*",), "any", True),
    (("*",), "x", True),
]


@pytest.mark.parametrize(("allowed", "interface", "expected"), CASES)
def test_an_interface_is_allowed_by_the_documented_glob_rule(allowed: tuple[str, ...], interface: str,
                                                             expected: bool) -> None:
    settings = CaptureSettings.parse({"allowed_interfaces": list(allowed)})
    assert settings.allows(interface) is expected
    if expected:
        settings.check_allowed([interface])
    else:
        with pytest.raises(DiagdError) as refused:
            settings.check_allowed([interface])
        assert refused.value.code == ErrorCode.PERMISSION_DENIED
        assert refused.value.details["interfaces"] == [interface]
        assert refused.value.message == f"interface {interface!r} is not in [capture] allowed_interfaces"


def test_every_refused_interface_is_named_in_order_and_the_first_in_the_message() -> None:
    settings = CaptureSettings.parse({"allowed_interfaces": list(DOC_EXAMPLE)})
    with pytest.raises(DiagdError) as refused:
        settings.check_allowed(["eth1", "wlan0", "veth3", "docker0", "ETH1"])
    error = refused.value
    assert error.code == ErrorCode.PERMISSION_DENIED
    assert error.message == "interface 'wlan0' is not in [capture] allowed_interfaces"
    assert error.details == {"interfaces": ["wlan0", "docker0", "ETH1"], "allowed": ["eth1", "veth*"],
                             "setting": "[capture] allowed_interfaces"}


def test_several_allowed_interfaces_pass_and_no_interface_is_nothing_to_refuse() -> None:
    settings = CaptureSettings.parse({"allowed_interfaces": list(DOC_EXAMPLE)})
    settings.check_allowed(["eth1", "veth0", "veth1"])
    settings.check_allowed([])


@pytest.mark.parametrize("interfaces", [["eth1"], ["any"], [], ["*"]])
def test_an_empty_allow_list_turns_capturing_off_whatever_is_asked(interfaces: list[str]) -> None:
    for settings in (CaptureSettings(), CaptureSettings.parse({}), CaptureSettings.parse({"allowed_interfaces": []})):
        assert settings.allowed_interfaces == ()
        assert not any(settings.allows(i) for i in ("eth1", "any", "*", ""))
        with pytest.raises(DiagdError) as refused:
            settings.check_allowed(interfaces)
        error = refused.value
        assert error.code == ErrorCode.PERMISSION_DENIED
        assert error.message == "live capture is off: [capture] allowed_interfaces is empty"
        assert error.details["setting"] == "[capture] allowed_interfaces"
        assert error.details["hint"] == ('name the interfaces (globs) diagd may capture on, e.g. allowed_interfaces = '
                                         '["eth1", "veth*"], then diagd reload')
        assert "interfaces" not in error.details


def test_the_documented_defaults() -> None:
    """docs/capture.md's [capture] example, which gives every default."""
    s = CaptureSettings.parse({})
    assert (s.path, s.allowed_interfaces, s.max_bytes, s.max_concurrent, s.max_duration_s, s.max_snaplen,
            s.buffer_mb, s.start_timeout_s, s.stop_grace_s, s.linger_s, s.keep_captures, s.allow_unconfined) == (
        "dumpcap", (), 1073741824, 4, 3600.0, 262144, 16, 10.0, 5.0, 60.0, 100, False)


@pytest.mark.parametrize(("key", "value"), [
    ("allowed_interfaces", "eth1"), ("allowed_interfaces", [1]), ("max_bytes", 0), ("max_concurrent", 0),
    ("max_duration_s", 0), ("max_snaplen", -1), ("buffer_mb", 0), ("start_timeout_s", 0.0), ("stop_grace_s", 0),
    ("linger_s", -1), ("keep_captures", 0), ("allow_unconfined", "yes"), ("allowed_interface", ["eth1"]),
])
def test_a_wrong_value_is_refused_naming_its_setting(key: str, value: object) -> None:
    with pytest.raises(DiagdError) as refused:
        CaptureSettings.parse({key: value})
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert refused.value.details["setting"] == f"[capture] {key}"


def test_linger_may_be_zero() -> None:
    assert CaptureSettings.parse({"linger_s": 0}).linger_s == 0.0


# -- dumpcap's command line --------------------------------------------------------------------------


def test_not_root_dumpcap_is_refused_unless_unconfined_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    refusing = CaptureSettings.parse({"allowed_interfaces": ["eth1"]})
    assert refusing.confined is False
    with pytest.raises(DiagdError) as refused:
        refusing.command(["-i", "eth1"], Path("/tmp/x"))
    assert refused.value.code == ErrorCode.PERMISSION_DENIED
    assert refused.value.details["setting"] == "[capture] allow_unconfined"
    assert refused.value.details["hint"] == ("run diagd as root, or set [capture] allow_unconfined = true to run "
                                             "dumpcap unconfined with its file capabilities")
    assert refused.value.message == ("live capture runs dumpcap in the sandbox, which needs diagd to run as root "
                                     "(dumpcap's own file capabilities do not survive no_new_privs)")
    unconfined = CaptureSettings.parse({"allow_unconfined": True, "path": "/opt/dumpcap"})
    assert unconfined.command(["-i", "eth1", "-w", "f"], Path("/tmp/x")) == ["/opt/dumpcap", "-i", "eth1", "-w", "f"]


def _policy_of(argv: list[str]) -> tuple[dict[str, object], list[str]]:
    """The launcher's policy document and the command it runs (sandbox.wrap's launcher line)."""
    sep = argv.index("--")
    return json.loads(argv[sep - 1]), argv[sep + 1:]


def test_as_root_dumpcap_runs_in_the_sandbox_writing_only_its_directory(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    s = CaptureSettings.parse({"allowed_interfaces": ["eth1"], "path": "dumpcap"})
    assert s.confined is True
    if shutil.which("dumpcap") is None:
        pytest.skip("dumpcap is not installed")
    doc, argv = _policy_of(s.command(["-i", "eth1", "-w", "f"], tmp_path))
    assert argv == ["dumpcap", "-i", "eth1", "-w", "f"]
    # docs/capture.md: keeps only CAP_NET_RAW and CAP_NET_ADMIN, writes only its capture's directory,
    # packet, netlink and inet sockets only, no program after its own execve
    assert doc["write"] == [str(tmp_path)]
    assert sorted(doc["keep_caps"]) == ["net_admin", "net_raw"]  # type: ignore[arg-type]
    assert sorted(doc["socket_families"]) == sorted(  # type: ignore[arg-type]
        [socket.AF_PACKET, socket.AF_NETLINK, socket.AF_INET, socket.AF_INET6])
    assert doc["exec_once"] is sandbox.seccomp_available()
    assert doc["landlock"] is (sandbox.landlock_abi() > 0)
    assert doc["net"] is False
    assert {"/sys", "/proc", "/usr"} <= set(doc["read"])  # type: ignore[arg-type]


def test_as_root_a_missing_dumpcap_is_backend_unavailable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    s = CaptureSettings.parse({"path": str(tmp_path / "no-dumpcap")})
    with pytest.raises(DiagdError) as refused:
        s.command(["-D"], tmp_path)
    assert refused.value.code == ErrorCode.BACKEND_UNAVAILABLE
    assert refused.value.message == f"dumpcap not found: {str(tmp_path / 'no-dumpcap')!r}"
    assert refused.value.details["fix"] == system.APT_HINT.format(pkg="wireshark-common")
    assert "apt" in refused.value.details["fix"] and "wireshark-common" in refused.value.details["fix"]


@pytest.mark.parametrize(("abi", "seccomp"), [(0, False), (1, True), (4, False)])
def test_the_dumpcap_policy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, abi: int, seccomp: bool) -> None:
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: abi)
    monkeypatch.setattr(sandbox, "seccomp_available", lambda: seccomp)
    policy = dumpcap_policy(tmp_path)
    assert policy.write == (str(tmp_path),)
    assert dumpcap_policy(None).write == ()
    assert set(policy.read) == {*sandbox.SYSTEM_READ, "/sys", "/proc"}
    assert set(policy.keep_caps) == {"net_raw", "net_admin"}
    assert set(policy.socket_families or ()) == {socket.AF_PACKET, socket.AF_NETLINK, socket.AF_INET,
                                                 socket.AF_INET6}
    assert policy.landlock is (abi > 0)
    assert policy.exec_once is seccomp
    assert policy.net is False and policy.exec == ()


def test_the_stop_steps_are_sigint_for_the_grace_then_sigkill() -> None:
    """docs/capture.md: SIGINT (dumpcap closes its file with statistics), then SIGKILL after stop_grace_s."""
    first, then = CaptureSettings.parse({"stop_grace_s": 2.5}).stop_steps()
    assert (first.name, first.signal, first.wait_s) == ("sigint", signal.SIGINT, 2.5)
    assert (then.name, then.signal) == ("sigkill", signal.SIGKILL)
    assert then.wait_s == 5.0  # how long the SIGKILLed dumpcap is waited for


# -- diagd reload ------------------------------------------------------------------------------------


def _config(allowed: list[str] | None) -> BackendConfig:
    return BackendConfig(table={} if allowed is None else {"allowed_interfaces": allowed})


@pytest.mark.parametrize(("before", "after", "noted"), [
    (None, ["eth1"], True), (["eth1"], [], True), ([], ["veth*"], True), (["eth1"], None, True),
    (["eth1"], ["eth2", "veth*"], False), (None, [], False), ([], None, False), (["eth1"], ["eth1"], False),
])
def test_reload_notes_only_turning_capture_on_or_off(before: list[str] | None, after: list[str] | None,
                                                     noted: bool) -> None:
    """docs/capture.md: the tools are listed only when allowed_interfaces was set at start; changing a
    non-empty list applies at once."""
    notes = check_reload(_config(before), _config(after))
    if not noted:
        assert notes == []
        return
    assert len(notes) == 1
    assert notes[0]["setting"] == "[capture] allowed_interfaces"
    assert notes[0]["applies_to"] == "the next daemon start"
    assert notes[0]["why"] == ("the capture tools are listed only when allowed_interfaces was set at start "
                               "(changing a non-empty list applies at once)")


def test_reload_refuses_a_broken_table() -> None:
    with pytest.raises(DiagdError) as refused:
        check_reload(_config(["eth1"]), BackendConfig(table={"max_bytes": -5}))
    assert refused.value.details["setting"] == "[capture] max_bytes"


def test_the_module_constants_match_the_documented_confinement() -> None:
    assert set(capture_settings.DUMPCAP_CAPS) == {"net_raw", "net_admin"}
