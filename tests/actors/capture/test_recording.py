"""Who sees a recording (recording.py): its owner, or once the owner has gone a client of the same user, and
either only with the tool groups its parts are read with; a client starts only a recording it could see."""

from __future__ import annotations

import pytest

from diagd.actors.capture.recording import Recording, check_groups, groups_for, not_found, user_of
from diagd.protocol.errors import DiagdError, ErrorCode

ALL = None  # a client of every group (`diagd call`, an MCP client without --tools)


def recording(owner: str = "mcp:100", *, capture: bool = True, ports: tuple[str, ...] = (),
              bpftrace: bool = False) -> Recording:
    return Recording(id="rec-0000abcd", owner=owner, dir="/nonexistent", capture_id="cap-0000abcd" if capture else None,
                     ports=list(ports), execution_id="bt-1" if bpftrace else None)


def test_the_groups_a_recording_is_read_with_are_those_of_its_parts() -> None:
    assert recording().groups() == {"capture", "pcap"}
    assert recording(capture=False, ports=("/dev/ttyUSB0",)).groups() == {"capture", "serial"}
    assert recording(ports=("/dev/ttyUSB0",), bpftrace=True).groups() == {"capture", "pcap", "serial", "bpftrace"}
    assert groups_for(capture=False, serial=False, bpftrace=True) == {"capture", "bpftrace"}


def test_the_owner_sees_it_with_the_groups_another_client_only_once_the_owner_has_gone() -> None:
    rec = recording(ports=("/dev/ttyUSB0",))
    mine = frozenset({"diagd", "capture", "pcap", "serial"})
    assert rec.visible_to("mcp:100", mine, owner_connected=True)
    assert rec.visible_to("mcp:100", ALL, owner_connected=True)
    assert rec.visible_to("mcp:100", frozenset({"capture", "pcap", "serial"}), owner_connected=True)  # exactly its own
    # another local client: not while the owner is connected; once it has gone, with the groups
    assert not rec.visible_to("mcp:200", ALL, owner_connected=True)
    assert not rec.visible_to("cli:300", ALL, owner_connected=True)
    assert rec.visible_to("mcp:200", mine, owner_connected=False)
    assert rec.visible_to("cli:300", ALL, owner_connected=False)
    # without a group its parts are read with: never, not even the owner's name (a pid used again)
    for client in ("mcp:100", "mcp:200"):
        for groups in (frozenset({"diagd", "capture", "pcap"}), frozenset({"diagd", "capture", "serial"})):
            assert not rec.visible_to(client, groups, owner_connected=False)
    # another user: an HTTP client of another token, and a local client for an HTTP client's recording
    assert not rec.visible_to("http:agent", ALL, owner_connected=False)
    theirs = recording("http:agent")
    assert theirs.visible_to("http:agent", ALL, owner_connected=True)
    assert not theirs.visible_to("http:other", ALL, owner_connected=False)
    assert not theirs.visible_to("cli:300", ALL, owner_connected=False)
    assert [user_of(c) for c in ("mcp:1", "cli:2", "http:agent")] == ["local", "local", "http:agent"]


def test_a_hidden_recording_is_answered_as_an_id_never_made() -> None:
    error = not_found("rec-0000abcd")
    assert error.code == ErrorCode.NOT_FOUND and error.message == "no recording 'rec-0000abcd'"
    assert "owner" not in error.details


@pytest.mark.parametrize(("args", "groups", "missing"), [
    ({"capture": {}}, {"diagd", "capture"}, ["pcap"]),
    ({"capture": {}, "serial_ports": ["/dev/ttyUSB0"]}, {"diagd", "capture", "pcap"}, ["serial"]),
    ({"bpftrace": {"program": "BEGIN {}"}, "serial_ports": ["p"]}, {"diagd", "capture"}, ["bpftrace", "serial"]),
])
def test_a_client_without_the_groups_of_a_part_cannot_start_it(args: dict[str, object], groups: set[str],
                                                                missing: list[str]) -> None:
    with pytest.raises(DiagdError) as refused:
        check_groups(args, frozenset(groups))
    assert refused.value.code == ErrorCode.PERMISSION_DENIED and refused.value.details["missing"] == missing
    needed = sorted({*missing, *(set(groups) - {"diagd"})})
    assert refused.value.details["needed"] == needed and refused.value.details["selected"] == sorted(groups)
    assert refused.value.message == (f"this recording is read with the tool groups {', '.join(needed)}; this client "
                                     f"has not selected {', '.join(missing)}, so it could not stop it nor read its "
                                     "bundle")
    assert refused.value.details["hint"] == f"select them too (diagd mcp --tools {','.join(needed)})"
    assert "diagd," not in refused.value.details["hint"] and all(g in refused.value.details["hint"] for g in missing)


def test_a_client_with_the_groups_starts_it() -> None:
    check_groups({"capture": {}, "serial_ports": ["p"]}, frozenset({"diagd", "capture", "pcap", "serial"}))
    check_groups({"capture": {}, "serial_ports": ["p"], "bpftrace": {}}, ALL)
    check_groups({"serial_ports": ["p"]}, frozenset({"diagd", "capture", "serial"}))  # no capture: no pcap
