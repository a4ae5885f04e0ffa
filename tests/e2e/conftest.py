"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import DaemonProcess, Env, start_daemon
from tests.pcaps import PCAPS

if TYPE_CHECKING:
    from tests.e2e.test_serial import SimProcess
    from tests.support.veth import Veth

SOURCE = PCAPS / "magma_gx_gy_combined_04.pcapng"
COPIES = 12  # ~35 MB: a filter pass takes long enough for another call to run beside it


@pytest.fixture(scope="session")
def bigger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SOURCE.exists():
        pytest.skip(f"{SOURCE} is absent (set DIAGD_TEST_PCAPS)")
    out = tmp_path_factory.mktemp("workers") / "bigger.pcapng"
    subprocess.run(["mergecap", "-a", "-w", str(out), *[str(SOURCE)] * COPIES], check=True, capture_output=True)
    return out


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimProcess]:
    """A simulated AT modem on a real pseudo-terminal (tests/e2e/test_serial.py). No periodic URC: a timer
    that talks while a reply is awaited makes any reply hold a URC by chance; tests ask for URCs with
    AT+SIMURC=<n>,<ms>, which the modem sends only after its OK."""
    from tests.e2e.test_serial import start_sim

    modem = start_sim(tmp_path / "modem0")
    yield modem
    modem.stop()


@pytest.fixture
def serial_daemon(env: Env, tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon that may open the test's modems (`tmp_path/modem*`)."""
    env.write_config(env.config.read_text() + f'\n[serial]\nallowed_ports = ["{tmp_path}/modem*"]\n')
    daemon = start_daemon(env)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def veth() -> Iterator[Veth]:
    """A veth pair, its sending end in a namespace of its own (tests/support/veth.py); root only."""
    from tests.support.veth import veth_pair

    with veth_pair() as pair:
        yield pair


@pytest.fixture
def capture_daemon(env: Env, veth: Veth) -> Iterator[DaemonProcess]:
    """A daemon that may capture on the veth pair's end."""
    from tests.support.veth import start_capture_daemon

    daemon = start_capture_daemon(env, veth)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def installed_diagd() -> Iterator[Path]:
    """`diagd` from a wheel of this checkout, in a venv of its own as pipx/uv tool make (0755 under /tmp:
    a throw-away uid may run it)."""
    from tests.support.wheel_venv import build_wheel, install_tool

    work = Path(tempfile.mkdtemp(prefix="diagd-wheel-", dir="/tmp"))
    work.chmod(0o755)
    try:
        yield install_tool(build_wheel(work), work / "tool-venv")
    finally:
        shutil.rmtree(work, ignore_errors=True)
