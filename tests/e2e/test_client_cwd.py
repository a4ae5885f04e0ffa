"""Relative paths in tool arguments mean the caller's working directory (read from /proc/<peer pid>/cwd),
through `diagd call` and through the MCP shim, never the daemon's. Small crafted dump/vmlinux files
make open_vmcore_session resolve both paths and refuse the pair (wrong kernel) before anything starts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import DIAGD, Env, start_daemon
from tests.fixtures.vmcore import fake_elf_core, fake_vmlinux

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed (scripts/setup.sh installs it)"),
]

INFO = "OSRELEASE=6.1.0-56-cloud-amd64\nBUILD-ID=3b43fad5034874490492495d552c0af6a5fab235\nKERNELOFFSET=2a400000\n"


def dumps(root: Path) -> Path:
    where = root / "work" / "dumps"
    where.mkdir(parents=True)
    fake_elf_core(where / "vmcore", INFO)
    fake_vmlinux(where / "vmlinux", release="5.10.0-99-amd64", build_id=b"\x11" * 20)
    return where


def assert_resolved_in(refused: dict[str, Any], where: Path) -> None:
    assert refused["code"] == "INVALID_ARGUMENT" and refused["details"]["reason"] == "vmlinux_mismatch", refused
    assert refused["details"]["vmcore"] == str(where / "vmcore")
    assert refused["details"]["vmlinux"] == str(where / "vmlinux")


def test_diagd_call_resolves_relative_paths_in_its_own_cwd(env: Env, tmp_path: Path) -> None:
    where = dumps(tmp_path)
    daemon = start_daemon(env)
    try:
        assert Path(f"/proc/{daemon.proc.pid}/cwd").resolve() != where.parent  # not where the daemon runs
        done = subprocess.run([DIAGD, "call", "open_vmcore_session", "vmcore_path=dumps/vmcore",
                               "vmlinux_path=./dumps/../dumps/vmlinux", "--visibility=off"],
                              cwd=where.parent, env=env.vars, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 1, done.stderr
        assert_resolved_in(json.loads(done.stdout), where)
        missing = subprocess.run([DIAGD, "call", "open_vmcore_session", "vmcore_path=vmcore",
                                  "vmlinux_path=vmlinux", "--visibility=off"],
                                 cwd=tmp_path, env=env.vars, capture_output=True, text=True, timeout=30, check=False)
        gone = json.loads(missing.stdout)
        assert gone["code"] == "FILE_NOT_FOUND" and gone["details"]["cwd"] == str(tmp_path)
    finally:
        daemon.stop()


async def test_the_shim_resolves_relative_paths_in_its_mcp_clients_cwd(env: Env, tmp_path: Path) -> None:
    where = dumps(tmp_path)
    daemon = start_daemon(env)
    try:
        params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=env.vars, cwd=where)
        async with Client(params, mode="legacy") as client:
            with trio.fail_after(60):
                result = await client.call_tool("open_vmcore_session", {"vmcore_path": "vmcore",
                                                                         "vmlinux_path": "vmlinux"})
                assert result.is_error
                assert_resolved_in(json.loads(result.content[0].text), where)
                # pcap resolves the same way (before tshark is involved)
                capture = await client.call_tool("pcap_info", {"pcap_path": "no-such.pcap"})
                missing = json.loads(capture.content[0].text)
                assert missing["code"] == "FILE_NOT_FOUND" and missing["details"]["cwd"] == str(where)
    finally:
        daemon.stop()
