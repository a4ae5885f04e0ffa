"""Fixtures of the fault suite: isolated real daemons with every back end given real inputs.

`rich_daemon` (one per test package run) serves the fuzzing and the escape tests: the real captures
are allowed, a simulated modem sits on a pty inside [serial] allowed_ports, and a crash/drgn session
is open on the real vmcore fixture. Bounds that keep a fuzzed call short (bpftrace max_run_s, crash
command timeouts) are set here; nothing that gates an escape (`allow_*`) is changed from its default.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SUPPORT, DaemonProcess, Env, start_daemon
from tests.fault.helpers import ControlClient
from tests.fixtures.vmcore import VmcoreFixture, build
from tests.pcaps import PCAPS

HAVE_CRASH = shutil.which("crash") is not None
needs_crash = pytest.mark.skipif(not HAVE_CRASH, reason="crash is not installed (scripts/setup.sh installs it)")
needs_sharkd = pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed")

# The largest real capture: filter passes over it take long enough to be interrupted.
BIG_PCAP = "magma_gx_gy_combined_04.pcapng"
SMALL_PCAP = "adrian_registration_reject.pcap"


def fault_env(root: Path, config: str, tag: str) -> Env:
    """An isolated runtime/state/config triple (the runtime path stays short: sockets are limited to 107 bytes)."""
    runtime = Path(f"/tmp/diagd-fault-{tag}-{os.getpid()}-{root.name[-8:]}")
    shutil.rmtree(runtime, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.toml").write_text(config)
    variables = {**os.environ, "DIAGD_RUNTIME_DIR": str(runtime), "DIAGD_STATE_DIR": str(root / "state"),
                 "DIAGD_CONFIG": str(root / "config.toml"),
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH", "")]))}
    variables.pop("NOTIFY_SOCKET", None)
    return Env(root, runtime, root / "state", root / "config.toml", variables)


@dataclass
class Modem:
    proc: subprocess.Popen[str]
    path: str
    link: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_modem(link: Path) -> Modem:
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "sim_modem.py"), "--link", str(link)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the simulated modem exited with {proc.wait(timeout=10)}"
    return Modem(proc, json.loads(line)["path"], link)


def open_session(daemon: DaemonProcess, fixture: VmcoreFixture, *crash_args: str, client: str = "setup",
                 ) -> dict[str, Any]:
    with ControlClient(daemon.control_socket, client=client, timeout=300) as c:
        return c.ok("open_vmcore_session", {"vmcore_path": str(fixture.vmcore), "vmlinux_path": str(fixture.vmlinux),
                                            "crash_args": list(crash_args)})


def daemon_config(root: Path, fixture: VmcoreFixture | None, extra: str = "") -> str:
    allowed = [str(PCAPS), str(root)] + ([str(fixture.dir)] if fixture else [])
    return ("[daemon]\n"
            f"allowed_dirs = {json.dumps(allowed)}\n"
            "idle_timeout_s = 900\n"
            "[serial]\n"
            f'allowed_ports = ["{root}/modem*"]\n'
            "[bpftrace]\n"
            "max_run_s = 5.0\n"
            "default_timeout_s = 2.0\n"
            "[crash]\n"
            "command_timeout_s = 30.0\n"
            "drgn_timeout_s = 30.0\n"
            # On, so its tools are listed and fuzzed, with a pattern no interface matches: nothing is captured.
            "[capture]\n"
            'allowed_interfaces = ["diagd-fuzz-none*"]\n'
            + extra)


@dataclass
class RichDaemon:
    daemon: DaemonProcess
    root: Path
    modem: Modem
    fixture: VmcoreFixture | None
    session_id: str | None

    @property
    def pid(self) -> int:
        return self.daemon.proc.pid

    def control(self, client: str = "fault", timeout: float = 60) -> ControlClient:
        return ControlClient(self.daemon.control_socket, client=client, timeout=timeout)


@pytest.fixture(scope="package")
def rich_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RichDaemon]:
    root = tmp_path_factory.mktemp("rich")
    fixture = build() if HAVE_CRASH else None
    env = fault_env(root, daemon_config(root, fixture), "rich")
    modem = start_modem(root / "modem0")
    daemon = start_daemon(env)
    try:
        session_id = None
        if fixture:
            # The escape tests' own session (`--hex`) loads beside the shared one: two loads for the time of one.
            with ThreadPoolExecutor(2) as pool:
                shared = pool.submit(open_session, daemon, fixture)
                pool.submit(open_session, daemon, fixture, "--hex", client="escape").result()
                session_id = shared.result()["session_id"]
        yield RichDaemon(daemon, root, modem, fixture, session_id)
    finally:
        daemon.stop()
        modem.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fault: the fault-and-fuzz suite (tests/fault; a few minutes, runs in CI)")
