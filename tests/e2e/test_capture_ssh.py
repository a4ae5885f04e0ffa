"""Live capture on a remote host over `diagd mcp --ssh`: the remote daemon's interfaces, its capture of
real replayed traffic, and the pcap tools reading that capture by id, all through a real OpenSSH
client and a private sshd (tests/support/sshd.py) — the same path every other tool takes."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import DIAGD, DaemonProcess
from tests.e2e.test_ssh import SSHD, Remote, remote_host  # noqa: F401  (the remote host fixture)
from tests.pcaps import pcap
from tests.support.veth import Veth, frames

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not SSHD.exists(), reason=f"{SSHD} is absent (openssh-server)")]


async def _ok(client: Client, tool: str, **args: object) -> dict[str, object]:
    result = await client.call_tool(tool, args)
    assert not result.is_error and result.structured_content is not None, result
    return result.structured_content


async def test_a_remote_hosts_interfaces_are_captured_and_analysed_over_ssh(
        remote_host: Remote, capture_daemon: DaemonProcess, veth: Veth, tmp_path: Path) -> None:  # noqa: F811
    sent = pcap("5greplay_oai.pcap")
    expected = frames(sent, tmp_path)
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--ssh", remote_host.sshd.target],
                                   env=remote_host.local)
    with trio.fail_after(120):
        async with Client(params, mode="legacy") as client:
            status = await _ok(client, "diagd_status")
            assert status["daemon"]["pid"] == capture_daemon.proc.pid  # type: ignore[index]
            listed = await _ok(client, "list_interfaces")
            allowed = [i["name"] for i in listed["interfaces"] if i["allowed"]]  # type: ignore[attr-defined]
            assert allowed == [veth.capture]
            started = await _ok(client, "start_capture", interfaces=[veth.capture], duration_s=120)
            await trio.to_thread.run_sync(veth.replay, sent)
            while (await _ok(client, "capture_status", capture_id=started["capture_id"]))["packets"] \
                    < len(expected):  # type: ignore[operator]
                await trio.sleep(0.1)
            done = await _ok(client, "stop_capture", capture_id=started["capture_id"])
            info = await _ok(client, "pcap_info", pcap_path=f"capture:{started['capture_id']}")
    assert done["packets"] == len(expected) and info["packet_count"] == len(expected)
    # What the remote host captured is what was sent, frame for frame.
    assert [f for path in done["files"] for f in frames(path, tmp_path)] == expected  # type: ignore[attr-defined]
    assert not (remote_host.local_runtime / "mcp.sock").exists()  # no local daemon was started
