"""A capture's record (record.py): its drop counters against independent sources, its files and bytes
against the disk, its summary, its store.

Drops: `drops.interface` is the interface drops of the last file's Interface Statistics Blocks
(docs/capture.md), here files built to the pcapng spec with known isb_ifrecv / isb_ifdrop / isb_osdrop
and read back by tshark's own pcapng file dissector (`-X read_format:"MIME Files Format"`, PDML), never
by diagd's reader; `drops.kernel` is the sum of dumpcap's per-interface `D` messages (sync_pipe.h:
indicator, 3-byte length, "<count>:<interface>"), one of them as a real dumpcap 4.0 sent it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from diagd.actors.capture import childmode, record
from diagd.actors.capture.record import Capture, CaptureStore
from diagd.protocol.errors import DiagdError, ErrorCode

# -- pcapng built to the spec (draft-ietf-opsawg-pcapng) -----------------------------------------------

IFRECV, IFDROP, OSDROP = 4, 5, 7  # the spec's isb_ifrecv, isb_ifdrop, isb_osdrop option codes


def _option(order: str, code: int, value: bytes) -> bytes:
    return struct.pack(order + "HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _block(order: str, kind: int, body: bytes) -> bytes:
    length = 12 + len(body)
    return struct.pack(order + "II", kind, length) + body + struct.pack(order + "I", length)


def pcapng(interfaces: list[str], stats: list[tuple[int, dict[int, int]]], order: str = "<",
           packets: int = 0) -> bytes:
    """A section with one IDB per name (Ethernet), `packets` EPBs on interface 0, then one ISB per
    (interface id, {option code: u64 value})."""
    end = struct.pack(order + "HH", 0, 0)
    shb = _block(order, 0x0A0D0D0A, struct.pack(order + "IHHq", 0x1A2B3C4D, 1, 0, -1) + end)
    idbs = b"".join(_block(order, 1, struct.pack(order + "HHI", 1, 0, 262144) + _option(order, 2, name.encode())
                           + end) for name in interfaces)
    frame = bytes(range(60))
    epbs = b"".join(_block(order, 6, struct.pack(order + "IIIII", 0, 0, n, len(frame), len(frame)) + frame)
                    for n in range(packets))
    isbs = b"".join(_block(order, 5, struct.pack(order + "III", if_id, 0, 0)
                           + b"".join(_option(order, code, struct.pack(order + "Q", v)) for code, v in opts.items())
                           + end) for if_id, opts in stats)
    return shb + idbs + epbs + isbs


def tshark_statistics(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The interface names (IDB order) and each ISB as tshark's pcapng dissector reads them; kept on disk by
    the file's sha256 (a mutation run re-runs these tests per mutant), never computed by diagd."""
    cache = Path(tempfile.gettempdir()) / f"diagd-capture-isb-{os.getuid()}" / (
        hashlib.sha256(path.read_bytes()).hexdigest() + ".json")
    if cache.is_file():
        names, isbs = json.loads(cache.read_text())
        return names, isbs
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.skip("tshark is not installed")
    found = _tshark_statistics(tshark, path)
    cache.parent.mkdir(mode=0o700, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(found))
    tmp.replace(cache)
    return found


def _tshark_statistics(tshark: str, path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    done = subprocess.run([tshark, "-r", str(path), "-X", "read_format:MIME Files Format", "-T", "pdml"],
                          capture_output=True, text=True, check=True)
    names: list[str] = []
    isbs: list[dict[str, Any]] = []
    for block in ET.fromstring(done.stdout).iter("field"):
        if block.get("name") != "pcapng.block":
            continue
        fields = {f.get("name"): f.get("show") for f in block.iter("field")}
        kind = int(str(fields["pcapng.block.type"]), 16)
        if kind == 1:
            names.append(str(fields.get("pcapng.options.option.data.interface.name")))
        elif kind == 5:
            isbs.append({"if_id": int(str(fields["pcapng.interface_id"])), **{
                key: int(str(fields[f"pcapng.options.option.data.interface.{field}"]))
                for key, field in (("received", "received"), ("ifdrop", "dropped"), ("osdrop", "dropped_by_os"))
                if f"pcapng.options.option.data.interface.{field}" in fields}})
    return names, isbs


def capture(tmp_path: Path, **fields: Any) -> Capture:
    values: dict[str, Any] = {"id": "cap-0000abcd", "owner": "mcp:1", "interfaces": ["eth1"], "filter": "",
                              "snaplen": 262144, "ring": {}, "stop_on": {}, "dir": str(tmp_path)} | fields
    return Capture(**values)


STATS_CASES = [
    # one interface
    (["eth1"], [(0, {IFRECV: 1000, IFDROP: 7, OSDROP: 3})]),
    # three: one without isb_ifdrop (nothing said: no drops counted), one with drops only by the OS
    (["eth1", "veth0", "lo"], [(0, {IFRECV: 1000, IFDROP: 7, OSDROP: 3}), (1, {IFRECV: 50, IFDROP: 12}),
                               (2, {IFRECV: 9})]),
    # an interface's statistics written twice: the last block counts
    (["eth1", "veth0"], [(0, {IFRECV: 10, IFDROP: 2}), (1, {IFRECV: 5, IFDROP: 1}), (0, {IFRECV: 40, IFDROP: 31})]),
    # large counts (u64), zero drops everywhere
    (["any"], [(0, {IFRECV: 2**40 + 5, IFDROP: 2**33 + 1, OSDROP: 2**35})]),
    (["eth1", "eth2"], [(0, {IFRECV: 3, IFDROP: 0, OSDROP: 0}), (1, {IFRECV: 4, IFDROP: 0, OSDROP: 9})]),
]


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize(("names", "stats"), STATS_CASES)
def test_interface_drops_are_the_last_statistics_blocks_as_tshark_reads_them(
        tmp_path: Path, names: list[str], stats: list[tuple[int, dict[int, int]]], order: str) -> None:
    path = tmp_path / "last.pcapng"
    path.write_bytes(pcapng(names, stats, order, packets=3))
    idb_names, isbs = tshark_statistics(path)
    assert idb_names == names
    last = {idb_names[b["if_id"]]: b for b in isbs}  # per interface, its last block
    expected_interface = sum(b.get("ifdrop", 0) for b in last.values())

    cap = capture(tmp_path, interfaces=names, files=[str(path)])
    with path.open("rb") as f:
        cap.interface_stats = childmode.interface_statistics(f) or None
    drops = cap.summary()["drops"]
    assert drops["interface"] == expected_interface
    assert drops["kernel"] is None and drops["by_interface"] is None  # no D message: dumpcap not heard at the end
    assert drops["interface_statistics"] == {
        name: {k: b[src] for k, src in (("received", "received"), ("interface_drops", "ifdrop"),
                                        ("os_drops", "osdrop")) if src in b} for name, b in last.items()}


def test_a_file_without_statistics_blocks_has_no_interface_drops(tmp_path: Path) -> None:
    """docs/capture.md: a ring's files (dumpcap 4.0) or a killed dumpcap's have none: drops.interface is null."""
    path = tmp_path / "ring.pcapng"
    path.write_bytes(pcapng(["eth1"], [], packets=2))
    assert tshark_statistics(path) == (["eth1"], [])
    cap = capture(tmp_path, files=[str(path)])
    with path.open("rb") as f:
        cap.interface_stats = childmode.interface_statistics(f) or None
    cap.drops_kernel = {"eth1": 4}
    drops = cap.summary()["drops"]
    assert drops == {"kernel": 4, "interface": None, "by_interface": {"eth1": 4}, "interface_statistics": None}


def sync_message(kind: str, payload: str) -> bytes:
    data = payload.encode() + b"\0"
    return kind.encode() + len(data).to_bytes(3, "big") + data


# What dumpcap 4.0.17 wrote on its sync pipe (`-Z none -i lo -i any -a duration:1 -w two.pcapng`).
RECORDED_SYNC = bytes.fromhex("4600000b" "74776f2e7063617" "06e6700" "44000005" "303a6c6f00" "44000006" "303a616e7900")


def kernel_drops(stream: bytes, chunk: int) -> dict[str, int]:
    """Per interface, the count of its D message (what the actor keeps), fed to the reader in chunks."""
    reader = childmode.SyncReader()
    found: dict[str, int] = {}
    for at in range(0, len(stream), chunk):
        for event in reader.feed(stream[at:at + chunk]):
            if event.kind == "D":
                name, count = childmode.parse_drops(event.text)
                found[name] = count
    return found


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_kernel_drops_are_the_sum_of_dumpcaps_per_interface_counts(tmp_path: Path, chunk: int) -> None:
    assert RECORDED_SYNC[:15] == b"F\0\0\x0btwo.pcapng\0"
    assert kernel_drops(RECORDED_SYNC, chunk) == {"lo": 0, "any": 0}
    sent = {"eth1": 17, "veth0": 0, "veth1": 1, "eth1.100": 250000}
    stream = sync_message("F", "/x/cap.pcapng") + sync_message("P", "12") + b"".join(
        sync_message("D", f"{count}:{name}") for name, count in sent.items())
    by_interface = kernel_drops(stream, chunk)
    assert by_interface == sent
    cap = capture(tmp_path, interfaces=list(sent))
    cap.drops_kernel = by_interface
    drops = cap.summary()["drops"]
    assert drops["kernel"] == 17 + 0 + 1 + 250000
    assert drops["by_interface"] == sent
    assert drops["interface"] is None and drops["interface_statistics"] is None


def test_both_counts_side_by_side_are_not_mixed(tmp_path: Path) -> None:
    path = tmp_path / "both.pcapng"
    path.write_bytes(pcapng(["eth1", "veth0"], [(0, {IFRECV: 100, IFDROP: 5, OSDROP: 40}),
                                               (1, {IFRECV: 100, IFDROP: 6, OSDROP: 50})]))
    names, isbs = tshark_statistics(path)
    cap = capture(tmp_path, interfaces=names)
    with path.open("rb") as f:
        cap.interface_stats = childmode.interface_statistics(f)
    cap.drops_kernel = {"eth1": 40, "veth0": 51}
    drops = cap.summary()["drops"]
    assert drops["interface"] == sum(b["ifdrop"] for b in isbs) == 11
    assert drops["kernel"] == 91


# -- files and bytes ---------------------------------------------------------------------------------


def test_files_and_bytes_follow_the_disk(tmp_path: Path) -> None:
    a, b, c = (tmp_path / f"ring_{n}.pcapng" for n in (1, 2, 3))
    a.write_bytes(b"a" * 1000)
    b.write_bytes(b"b" * 300)
    cap = capture(tmp_path, files=[str(a), str(b)])
    assert cap.bytes_written == 0 and cap.bytes_on_disk() == 0
    cap.refresh_files()
    assert cap.files == [str(a), str(b)]
    assert cap.file_sizes == {str(a): 1000, str(b): 300}
    assert (cap.bytes_written, cap.bytes_on_disk()) == (1300, 1300)
    # the ring drops its oldest file and goes on: its size stays written, no longer on disk
    a.unlink()
    c.write_bytes(b"c" * 77)
    cap.files.append(str(c))
    b.write_bytes(b"b" * 500)
    cap.refresh_files()
    assert cap.files == [str(b), str(c)]
    assert cap.file_sizes == {str(a): 1000, str(b): 500, str(c): 77}
    assert (cap.bytes_written, cap.bytes_on_disk()) == (1577, 577)
    summary = cap.summary()
    assert (summary["files"], summary["current_file"], summary["files_written"]) == ([str(b), str(c)], str(c), 3)
    assert (summary["bytes_written"], summary["bytes_on_disk"]) == (1577, 577)
    assert summary["files"] is not cap.files


def test_views_bytes_counts_the_regular_files_of_views_only(tmp_path: Path) -> None:
    cap = capture(tmp_path)
    assert cap.views_bytes() == 0  # no views dir
    views = tmp_path / "views"
    views.mkdir()
    assert cap.views_bytes() == 0
    (views / "v1.pcapng").write_bytes(b"x" * 123)
    (views / "v2.pcapng").write_bytes(b"y" * 4000)
    (views / "sub").mkdir()
    (views / "sub" / "deep").write_bytes(b"z" * 99999)
    outside = tmp_path / "outside"
    outside.write_bytes(b"o" * 5555)
    (views / "link").symlink_to(outside)
    assert cap.views_bytes() == 4123


def test_a_capture_without_files(tmp_path: Path) -> None:
    summary = capture(tmp_path).summary()
    assert (summary["files"], summary["current_file"], summary["files_written"], summary["bytes_written"],
            summary["bytes_on_disk"]) == ([], None, 0, 0, 0)
    assert summary["drops"] == {"kernel": None, "interface": None, "by_interface": None,
                                "interface_statistics": None}


# -- the summary ---------------------------------------------------------------------------------------


def iso(ts: float) -> str:
    """The documented form: UTC, microseconds, Z."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@pytest.mark.parametrize("status", ["starting", "running", "stopped", "failed", "interrupted"])
def test_the_summary_says_every_field(tmp_path: Path, status: str) -> None:
    cap = capture(tmp_path, id="cap-1a2b3c4d", owner="http:agent", interfaces=["eth1", "veth0"], filter="udp",
                  snaplen=1500, ring={"ring_files": 3}, stop_on={"packets": 10, "duration_s": 60.0},
                  status=status, stop_reason="packets", stopped_by="cli:2", error="boom", pid=4321, packets=99,
                  created_at=1700000000.25, started_at=1700000001.5, ended_at=1700000011.75,
                  excluded_tcp_ports=[8080], applied_filter="(udp) and not (tcp port 8080)", evicted=True)
    summary = cap.summary(owner_connected=True)
    running = status in ("starting", "running")
    assert cap.running is running
    assert summary == {
        "capture_id": "cap-1a2b3c4d", "status": status, "running": running, "stop_reason": "packets",
        "stopped_by": "cli:2", "error": "boom", "owner": "http:agent", "owner_connected": True,
        "interfaces": ["eth1", "veth0"], "filter": "udp", "applied_filter": "(udp) and not (tcp port 8080)",
        "excluded_tcp_ports": [8080], "snaplen": 1500, "ring": {"ring_files": 3},
        "stop_on": {"packets": 10, "duration_s": 60.0}, "packets": 99, "bytes_written": 0, "bytes_on_disk": 0,
        "drops": {"kernel": None, "interface": None, "by_interface": None, "interface_statistics": None},
        "files": [], "current_file": None, "files_written": 0, "evicted": True, "dir": str(tmp_path),
        "created_at": "2023-11-14T22:13:20.250000Z", "started_at": "2023-11-14T22:13:21.500000Z",
        "ended_at": "2023-11-14T22:13:31.750000Z", "elapsed_s": 10.25, "pid": 4321}
    assert summary["created_at"] == iso(1700000000.25) and summary["ended_at"] == iso(1700000011.75)


def test_the_summary_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cap = capture(tmp_path, filter="tcp", created_at=1000.0)
    # a record made before applied_filter: the filter; not started: elapsed from its creation to now
    monkeypatch.setattr(record.time, "time", lambda: 1012.3456)
    summary = cap.summary()
    assert summary["applied_filter"] == "tcp"
    assert summary["owner_connected"] is None
    assert (summary["started_at"], summary["ended_at"]) == (None, None)
    assert summary["created_at"] == "1970-01-01T00:16:40.000000Z"
    assert summary["elapsed_s"] == 12.346
    assert summary["status"] == "starting" and summary["running"] is True and summary["evicted"] is False
    assert summary["pid"] is None and summary["stop_reason"] is None and summary["packets"] == 0
    cap.started_at = 1010.0  # running: from its start to now
    assert cap.summary()["elapsed_s"] == 2.346
    cap.ended_at = 1011.0
    assert cap.summary()["elapsed_s"] == 1.0
    cap.started_at = 0.0  # a start at the epoch is a start
    cap.ended_at = 0.5
    assert cap.summary()["started_at"] == "1970-01-01T00:00:00.000000Z"


@pytest.mark.parametrize("ts", [0.0, 0.5, 1.000001, 1700000000.0, 1700000000.125, 1764979200.9375])
def test_times_are_utc_with_microseconds(tmp_path: Path, ts: float) -> None:
    assert capture(tmp_path, created_at=ts).summary()["created_at"] == iso(ts)


async def test_notify_wakes_every_waiter_once() -> None:
    cap = Capture(id="cap-0000abcd", owner="o", interfaces=[], filter="", snaplen=1, ring={}, stop_on={}, dir="/x")
    woke: list[int] = []

    async def waiter(n: int) -> None:
        await cap.wait_changed()
        woke.append(n)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, 1)
        nursery.start_soon(waiter, 2)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        cap.notify()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woke) == [1, 2]
        # a new wait needs a new change
        nursery.start_soon(waiter, 3)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woke) == [1, 2]
        cap.notify()
    assert sorted(woke) == [1, 2, 3]


# -- the store -----------------------------------------------------------------------------------------


def test_a_record_survives_the_store(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    cap = capture(tmp_path / "exports" / "cap-0000abcd", status="stopped", packets=5, drops_kernel={"eth1": 2},
                  interface_stats={"eth1": {"received": 9, "interface_drops": 1}}, file_sizes={"/f": 3},
                  reserved_bytes=4096, autostop_kb=64, created_at=12.5)
    store.save(cap)
    assert (tmp_path / "captures" / "cap-0000abcd.json").is_file()
    assert not list((tmp_path / "captures").glob("*.tmp"))
    loaded = store.load("cap-0000abcd")
    assert loaded is not None and loaded.to_json() == cap.to_json()
    assert loaded.summary()["drops"] == {"kernel": 2, "interface": 1, "by_interface": {"eth1": 2},
                                         "interface_statistics": {"eth1": {"received": 9, "interface_drops": 1}}}
    # keys a newer daemon wrote are ignored; a missing or broken record is no record
    assert Capture.from_json({**cap.to_json(), "future_key": 1}).to_json() == cap.to_json()
    assert store.load("cap-ffffffff") is None
    (tmp_path / "captures" / "cap-00000bad.json").write_text("{not json")
    assert store.load("cap-00000bad") is None
    (tmp_path / "captures" / "cap-0000dead.json").write_text('{"id": "cap-0000dead"}')  # fields missing
    assert store.load("cap-0000dead") is None


@pytest.mark.parametrize("bad", ["cap-1234567", "cap-123456789", "cap-ABCDEF12", "../cap-00000000", "cap-0000000g",
                                 "rec-00000000", "cap-00000000.json", "", "cap-00000000\n"])
def test_a_capture_id_is_cap_and_8_hex_digits(tmp_path: Path, bad: str) -> None:
    store = CaptureStore(tmp_path)
    assert store.meta_path("cap-0a1b2c3d") == tmp_path / "captures" / "cap-0a1b2c3d.json"
    with pytest.raises(DiagdError) as refused:
        store.meta_path(bad)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert refused.value.message == f"not a capture id: {bad!r}"
    assert refused.value.details == {"hint": "capture ids look like cap-1a2b3c4d (start_capture, list_captures)"}


def test_new_capture_ids_are_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CaptureStore(tmp_path)
    store.save(capture(tmp_path, id="cap-00000002"))
    drawn = iter(["00000001", "00000002", "00000003"])
    monkeypatch.setattr(record.secrets, "token_hex", lambda n: next(drawn) if n == 4 else "wrong size")
    assert store.new_id({"cap-00000001"}) == "cap-00000003"  # taken by a live one, then by a record


def test_make_dir_and_all_in_creation_order(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    assert store.root == tmp_path
    assert store.all() == []
    made = store.make_dir("cap-0000000a")
    assert made == tmp_path / "exports" / "cap-0000000a" and made.is_dir() and (tmp_path / "captures").is_dir()
    for cid, created in (("cap-0000000a", 30.0), ("cap-0000000b", 10.0), ("cap-0000000c", 20.0)):
        store.save(capture(tmp_path, id=cid, created_at=created))
    (tmp_path / "captures" / "cap-000000ff.json").write_text("broken")
    (tmp_path / "captures" / "other.json").write_text("{}")
    assert [c.id for c in store.all()] == ["cap-0000000b", "cap-0000000c", "cap-0000000a"]


def test_recover_marks_running_captures_interrupted_keeping_files_and_counters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CaptureStore(tmp_path)
    kept, gone = tmp_path / "kept.pcapng", tmp_path / "gone.pcapng"
    kept.write_bytes(b"k" * 64)
    for cid, status, ended in (("cap-00000001", "running", None), ("cap-00000002", "starting", 55.0),
                               ("cap-00000003", "stopped", 60.0), ("cap-00000004", "failed", None)):
        store.save(capture(tmp_path, id=cid, status=status, pid=99, packets=7, ended_at=ended, created_at=1.0,
                           files=[str(kept), str(gone)], drops_kernel={"eth1": 3}, stop_reason=None))
    monkeypatch.setattr(record.time, "time", lambda: 100.0)
    assert store.recover() == ["cap-00000001", "cap-00000002"]
    for cid, ended in (("cap-00000001", 100.0), ("cap-00000002", 55.0)):
        cap = store.load(cid)
        assert cap is not None
        assert (cap.status, cap.stop_reason, cap.ended_at, cap.pid) == ("interrupted", "daemon_stopped", ended, None)
        assert (cap.files, cap.file_sizes[str(kept)], cap.packets, cap.drops_kernel) == ([str(kept)], 64, 7,
                                                                                         {"eth1": 3})
    for cid, status in (("cap-00000003", "stopped"), ("cap-00000004", "failed")):
        cap = store.load(cid)
        assert cap is not None and (cap.status, cap.pid, cap.stop_reason) == (status, 99, None)
    assert store.recover() == []


def test_evicting_removes_files_and_views_and_says_the_bytes(tmp_path: Path) -> None:
    store = CaptureStore(tmp_path)
    folder = store.make_dir("cap-0000000e")
    (folder / "f1.pcapng").write_bytes(b"1" * 700)
    (folder / "f2.pcapng").write_bytes(b"2" * 300)
    (folder / "views").mkdir()
    (folder / "views" / "merged.pcapng").write_bytes(b"m" * 1000)
    cap = capture(folder, id="cap-0000000e", status="stopped", files=[str(folder / "f1.pcapng"),
                                                                      str(folder / "f2.pcapng")])
    cap.refresh_files()
    cap.file_sizes["/an/old/ring/file"] = 5000  # written, already gone: frees nothing
    store.save(cap)
    assert store.evict_files(cap) == 700 + 300 + 1000
    assert not folder.exists()
    assert (cap.files, cap.evicted, cap.bytes_written) == ([], True, 6000)
    loaded = store.load("cap-0000000e")
    assert loaded is not None and loaded.evicted and loaded.files == []
    store.forget(cap)
    assert store.load("cap-0000000e") is None and not (tmp_path / "captures" / "cap-0000000e.json").exists()
    store.forget(cap)  # twice: nothing left, no error
    assert store.evict_files(cap) == 0  # its folder already gone: nothing freed, no error
    kept = capture(store.make_dir("cap-0000000f"), id="cap-0000000f", status="stopped")
    (Path(kept.dir) / "f.pcapng").write_bytes(b"f")
    store.save(kept)
    store.forget(kept)
    assert not Path(kept.dir).exists() and store.load("cap-0000000f") is None
