"""Kernel module debug info (load_module_debuginfo: crash `mod -S DIR`, drgn loading the .ko files) on the
fixture dump, whose guest loaded qemu_fw_cfg before the panic; cross-checked with crash and drgn run directly."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Env, start_daemon
from tests.e2e.test_mcp import mcp_client
from tests.e2e.test_timeline import error, ok
from tests.fixtures.vmcore import (
    VmcoreFixture,
    vmcore_fixture,  # noqa: F401 - the fixture
)

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed")]

COMMANDS = ["p fw_cfg_sysfs_probe", "struct fw_cfg_sysfs_entry"]


def crash_direct(fixture: VmcoreFixture, module_dir: Path, out: Path) -> list[str]:
    """The same commands in crash run directly, after the same `mod -S`."""
    script = f"mod -S {module_dir}\n" + "".join(f"{c} > {out}/{i}.txt\n" for i, c in enumerate(COMMANDS)) + "quit\n"
    subprocess.run(["crash", "-s", str(fixture.vmlinux), str(fixture.vmcore)], input=script, capture_output=True,
                   text=True, timeout=300, check=True)
    return [(out / f"{i}.txt").read_text().rstrip("\n") for i in range(len(COMMANDS))]


def drgn_direct(fixture: VmcoreFixture, module: Path) -> str:
    code = ("import drgn, sys\nprog = drgn.Program()\nprog.set_core_dump(sys.argv[1])\n"
            "prog.load_debug_info([sys.argv[2], sys.argv[3]])\n"
            "print(hex(prog.symbol('fw_cfg_sysfs_probe').address), prog.type('struct fw_cfg_sysfs_entry').size)\n")
    return subprocess.run([sys.executable, "-c", code, str(fixture.vmcore), str(fixture.vmlinux),
                           str(module)], capture_output=True, text=True, timeout=120, check=True).stdout.strip()


async def test_module_symbols_and_types_resolve_as_crash_and_drgn_resolve_them(
        env: Env, tmp_path: Path, vmcore_fixture: VmcoreFixture) -> None:  # noqa: F811 - the fixture
    # The fixture keeps the module's debug .ko beside the dump (a directory crash's sandbox reads).
    modules = vmcore_fixture.dir
    hidden = tmp_path / "modules"
    hidden.mkdir()
    daemon = start_daemon(env)
    try:
        async with mcp_client(daemon.env) as client:
            session = await ok(client, "open_vmcore_session", vmcore_path=str(vmcore_fixture.vmcore),
                               vmlinux_path=str(vmcore_fixture.vmlinux))
            sid = session["session_id"]
            loaded = await ok(client, "load_module_debuginfo", dir=str(modules), session_id=sid)
            assert any(str(modules / vmcore_fixture.module.name) in out for out in loaded["modules"])
            assert str(modules / vmcore_fixture.module.name) in loaded["files"]
            got = [(await ok(client, "run_crash_command", command=c, session_id=sid))["output"].rstrip("\n")
                   for c in COMMANDS]
            drgn = await ok(client, "run_drgn_command", session_id=sid,
                            code="print(hex(prog.symbol('fw_cfg_sysfs_probe').address), "
                                 "prog.type('struct fw_cfg_sysfs_entry').size)")
            missing = await error(client, "load_module_debuginfo", dir=str(tmp_path / "nope"), session_id=sid)
            assert missing["code"] == "FILE_NOT_FOUND"
            empty = await error(client, "load_module_debuginfo", dir=str(hidden), session_id=sid)
            assert empty["code"] == "NOT_FOUND" and "no .ko file" in empty["message"]
    finally:
        daemon.stop()
    expected = crash_direct(vmcore_fixture, modules, tmp_path)
    assert got == expected and "fw_cfg_sysfs_probe" in got[0] and "SIZE: 144" in got[1]
    # drgn loaded the module too (an error there is a failure, not a reason to compare nothing), and it
    # resolves the symbol and the type as drgn run directly does and as crash does.
    assert "error" not in loaded["drgn"], loaded["drgn"]
    direct = drgn_direct(vmcore_fixture, modules / vmcore_fixture.module.name)
    assert drgn["output"].strip() == direct
    address, size = direct.split()
    crash_address = re.search(r"0x[0-9a-f]+", got[0])
    assert crash_address is not None and int(crash_address[0], 16) == int(address, 16), (got[0], direct)
    assert f"SIZE: {size}" in got[1]
