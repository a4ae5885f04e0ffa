"""The index builder (actors/pcap/index/build.py) as the daemon runs it: a process of its own.

A tshark killed midway (out of memory, a dissector's crash) is no index, whatever rows it printed; two
builds of one index at once (two daemons, two versions of one file) leave one whole index and nothing
half-written; the store sweeps the folders of builds killed with their process group, never one whose
build still runs (its lock is held); the daemon stops a build that says no progress for BUILD_STALL_S.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from diagd.actors.pcap import index_actor
from diagd.actors.pcap.index.build import LOCK_FILE, META_FILE, PARTIAL, command
from diagd.actors.pcap.index.schema import COLUMNS
from diagd.actors.pcap.index.store import IndexStore
from diagd.actors.pcap.index.tables import FRAMES_DIR, frame_files
from tests.pcaps import PCAPS

GIVEN = {"number": "1", "time_relative": "0.000000", "src": "a", "dst": "b", "protocol": "P", "length": "60",
         "info": "info", "time_epoch": "1.0", "rel_ns": "0.000000000", "cap_len": "60", "protocols": "eth"}
ROW = "\t".join(GIVEN.get(c.name, "") for c in COLUMNS)


def fake_tshark(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "tshark"
    script.write_text(f"#!/bin/sh\nif [ \"$1\" = -v ]; then echo 'TShark (fake)'; exit 0; fi\n{body}\n")
    script.chmod(0o755)
    return script


def run(out: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(out, argv), capture_output=True, text=True, timeout=120, check=False)


def test_a_tshark_killed_midway_is_no_index_whatever_it_printed(tmp_path: Path) -> None:
    tshark = fake_tshark(tmp_path, f"printf '{ROW}\\n{ROW}\\n{ROW}\\n'\nkill -9 $$")
    out = tmp_path / "index" / ("a" * 64 + "-" + "b" * 12)
    done = run(out, [str(tshark), "-r", "x"])
    assert done.returncode != 0 and "tshark was killed (signal 9)" in done.stderr, done
    assert not out.exists() and not list(out.parent.glob(f"*{PARTIAL}*"))


def test_a_whole_fake_pass_is_an_index(tmp_path: Path) -> None:
    tshark = fake_tshark(tmp_path, f"printf '{ROW}\\n{ROW}\\n'")
    out = tmp_path / "index" / ("a" * 64 + "-" + "b" * 12)
    done = run(out, [str(tshark), "-r", "x"])
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / META_FILE).read_text())
    assert meta["frames"] == 2 and meta["tshark_version"] == "TShark (fake)"
    assert [f.name for f in frame_files(out)] == ["000000000001.parquet"]
    assert not (out / LOCK_FILE).exists()


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_two_builds_of_one_index_at_once_leave_one_whole_index(tmp_path: Path) -> None:
    capture = PCAPS / "magma_gx_gy_combined_04.pcapng"
    if not capture.exists():
        pytest.skip(f"{capture.name} is not in the corpus")
    out = tmp_path / "index" / ("c" * 64 + "-" + "d" * 12)
    argv = ["tshark", "-r", str(capture), "-n", "-2"]
    builds = [subprocess.Popen(command(out, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    results = [(b.wait(timeout=120), b.stderr.read() if b.stderr else "") for b in builds]
    assert [code for code, _ in results] == [0, 0], results
    store = IndexStore(out.parent, 10**9)
    stored = store.ready(out)
    assert stored is not None and stored.meta["frames"] == 4070
    import duckdb

    count = duckdb.connect().execute(f"SELECT count(*) FROM read_parquet('{out / FRAMES_DIR}/*.parquet')").fetchone()
    assert count == (4070,)
    assert not list(out.parent.glob(f"*{PARTIAL}*")), "a build's own folder was left"


def test_the_sweep_removes_killed_builds_never_a_running_one(tmp_path: Path) -> None:
    store = IndexStore(tmp_path, 10**9)
    killed = tmp_path / f"{'e' * 64}-{'f' * 12}{PARTIAL}killed"
    running = tmp_path / f"{'e' * 64}-{'f' * 12}{PARTIAL}running"
    for folder in (killed, running):
        folder.mkdir()
        (folder / LOCK_FILE).write_bytes(b"")
        (folder / FRAMES_DIR).mkdir()
        (folder / FRAMES_DIR / "next.parquet.writing").write_bytes(b"half")
    with open(running / LOCK_FILE, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as the running builder holds it
        assert store.sweep() == [killed.name]
    assert not killed.exists() and running.exists()


async def test_a_build_silent_past_its_stall_bound_is_stopped_with_its_tshark(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A dissector looping on one frame prints nothing more: the build is stopped (its whole process group,
    the tshark under the builder too) and its failure coded, instead of holding the build slot for good."""
    pid_file = tmp_path / "tshark.pid"
    tshark = fake_tshark(tmp_path, f"echo $$ > {pid_file}\nprintf '{ROW}\\n'\nexec sleep 600")
    monkeypatch.setattr(index_actor, "BUILD_STALL_S", 2.0)
    store = IndexStore(tmp_path / "index", 1 << 30)

    async def locate() -> Path:
        return store.path_for("a" * 64, "b" * 12)

    actor = index_actor.IndexActor("pcap-index:x", tmp_path / "x.pcap", [str(tshark), "-r", "x"], store, locate)
    with trio.fail_after(60):
        await actor._find_or_build()
    assert actor.error is not None and "no progress for 2 s after frame 0 (stopped)" in actor.error.message, actor.error
    pid = int(pid_file.read_text())
    with trio.fail_after(10):
        while _running(pid):
            await trio.sleep(0.05)
    assert not store.ready(store.path_for("a" * 64, "b" * 12))


def _running(pid: int) -> bool:
    """The process is alive (not gone, not a zombie awaiting its reaper)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and os.path.exists(f"/proc/{pid}")
