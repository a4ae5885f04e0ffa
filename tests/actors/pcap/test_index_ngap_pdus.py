"""The NGAP PDUs of an indexed capture (index/ngap_pdus.py) on a real index and a real sharkd: a reading
cancelled mid-way leaves no cut behind, a stored file that does not read is read again from the capture,
and what another version of the reader kept is removed when this one stores its own."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from diagd.actors.pcap.index import ngap_pdus
from diagd.actors.pcap.index.build import PARTIAL, command
from diagd.actors.pcap.shark import tshark as cold
from tests.pcaps import PCAPS

pytestmark = pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd is not installed")

SOURCE = PCAPS / "adrian_sandbox_n2.pcap"
DECODING = ngap_pdus.Decoding((), (("sctp.association_index", "TRUE"), ("nas-5gs.null_decipher", "TRUE")))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SOURCE.exists():
        pytest.skip(f"{SOURCE.name} is not in the corpus")
    out = tmp_path_factory.mktemp("index") / ("a" * 64 + "-" + "0" * 12)
    done = subprocess.run(command(out, cold.base_argv(SOURCE, (), ())), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return out


def frames(index: Path) -> int:
    return int(json.loads((index / "meta.json").read_text())["frames"])


def leftovers(index: Path) -> list[str]:
    return [p.name for p in index.parent.glob(f"*{PARTIAL}*")]


async def test_a_reading_cancelled_midway_leaves_no_cut(index: Path) -> None:
    async def cancel_once_cut(scope: trio.CancelScope) -> None:
        while not list(index.parent.glob(f"*{PARTIAL}*/cut.pcap")):
            await trio.sleep(0.001)
        scope.cancel()

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_cut, scope)
            await ngap_pdus.pdus(SOURCE, index, frames(index), DECODING)
    assert scope.cancelled_caught and leftovers(index) == []


async def test_a_stored_file_that_does_not_read_is_read_again_and_old_versions_go(index: Path) -> None:
    first = await ngap_pdus.pdus(SOURCE, index, frames(index), DECODING)
    stored = index / ngap_pdus.PDUS_FILE.format(ngap_pdus.READER, DECODING.digest())
    assert first and stored.exists()
    stored.write_bytes(b"\x80\x09")  # a pickle protocol no Python writes
    stale = index / ngap_pdus.PDUS_FILE.format("0" * 12, DECODING.digest())
    stale.write_bytes(b"an older reader's")
    again = await ngap_pdus.pdus(SOURCE, index, frames(index), DECODING)
    assert [p.frame for p in again] == [p.frame for p in first]
    assert stored.exists() and not stale.exists() and leftovers(index) == []
