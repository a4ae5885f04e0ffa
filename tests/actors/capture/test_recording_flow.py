"""A recording's start and stop (recording.py) against what docs/capture.md ("Recording a reproduction")
and the module's docstring say, with the other groups' tools played by a scripted caller: the tools called,
in the documented order, with what arguments; a failed part stops what started and leaves nothing; the
bundle's parts (the capture's counters and drops as stop_capture answered them, the bpftrace output, the
serial exports, the timeline); the record store (ids, prune, load).
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing
import trio
import trio.lowlevel

from diagd.actors.capture import recording
from diagd.actors.capture.recording import Recording, RecordingStore, start, stop
from diagd.protocol.errors import DiagdError, ErrorCode

CAPTURE_ID, EXECUTION_ID = "cap-0000aaaa", "bt-29fc9142"
STOPPED_CAPTURE = {"capture_id": CAPTURE_ID, "status": "stopped", "stop_reason": "requested", "packets": 44,
                   "drops": {"kernel": 3, "interface": 1, "by_interface": {"veth0": 3},
                             "interface_statistics": {"veth0": {"received": 47, "interface_drops": 1}}},
                   "files": ["/s/capture/exports/cap-0000aaaa/cap.pcapng"], "interfaces": ["veth0"],
                   "filter": "sctp", "bytes_written": 9999, "owner": "mcp:1"}


class Tools:
    """The other groups' tools as Runtime.call reaches them: every call logged, answers scripted."""

    def __init__(self, fail: dict[str, DiagdError] | None = None, *, output: list[Any] | None = None,
                 rows: int = 3, has_more: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail or {}
        self.output = ["marker 16842", {"@count": 2}, "last"] if output is None else output
        self.rows, self.has_more = rows, has_more
        self.already_open = {"/dev/ttyS1"}

    async def __call__(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((tool, args))
        if tool in self.fail:
            raise self.fail[tool]
        match tool:
            case "start_capture":
                return {"capture_id": CAPTURE_ID, "status": "running"}
            case "exec_program":
                return {"execution_id": EXECUTION_ID}
            case "configure_connection" if args.get("action") == "close":
                return {"port": args["port"], "outcome": "closed"}
            case "configure_connection":
                port = "/dev/" + Path(args["port"]).name  # its canonical path (a by-id link resolved)
                return {"port": port, "outcome": "already_open" if port in self.already_open else "opened"}
            case "stop_capture":
                return dict(STOPPED_CAPTURE)
            case "stop_execution":
                return {"status": "stopped"}
            case "get_result":
                return {"output": self.output, "status": "stopped", "lines_total": len(self.output),
                        "has_more": self.has_more}
            case "export_serial_pcapng":
                return {"pcapng_path": f"/s/serial/exports/{args['name']}.pcapng", "packets": 4}
            case "diagd_timeline":
                return {"rows": [{"n": n} for n in range(self.rows)], "total": self.rows + 10,
                        "sources": [s["label"] for s in args["sources"]], "span": {"first": 1, "last": 2}}
        raise AssertionError(f"unexpected tool {tool}")

    def tools(self) -> list[str]:
        return [t for t, _ in self.calls]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> itertools.count[float]:
    """time.time() in recording.py's functions (started_at, stopped_at): 100.0, 101.0, ... one a call."""
    ticks = itertools.count(100.0)
    monkeypatch.setattr(recording.time, "time", lambda: next(ticks))
    return ticks


ALL_PARTS = {"capture": {"interfaces": ["veth0"], "filter": "sctp"}, "bpftrace": {"program": "BEGIN {}", "timeout": 50},
             "serial_ports": ["/dev/serial/by-id/usb-modem0", "/dev/ttyS1"], "serial_settings": {"baudrate": 9600}}


async def test_start_calls_capture_then_program_then_ports(tmp_path: Path, clock: object) -> None:
    tools, store = Tools(), RecordingStore(tmp_path)
    rec = await start(tools, store, "mcp:1", ALL_PARTS, keep=5)
    assert tools.calls == [
        ("start_capture", {"interfaces": ["veth0"], "filter": "sctp"}),
        ("exec_program", {"program": "BEGIN {}", "timeout": 50}),
        ("configure_connection", {"port": "/dev/serial/by-id/usb-modem0", "baudrate": 9600}),
        ("configure_connection", {"port": "/dev/ttyS1", "baudrate": 9600})]
    assert re.fullmatch(r"rec-[0-9a-f]{8}", rec.id)
    assert (rec.owner, rec.status, rec.capture_id, rec.execution_id) == ("mcp:1", "recording", CAPTURE_ID,
                                                                         EXECUTION_ID)
    assert rec.ports == ["/dev/usb-modem0", "/dev/ttyS1"]  # as opened (canonical)
    assert rec.opened_ports == ["/dev/usb-modem0"]  # ttyS1 was open already: it stays open at the stop
    assert rec.dir == str(tmp_path / "exports" / rec.id) and Path(rec.dir).is_dir()
    assert rec.started_at == 100.0 and rec.stopped_at is None
    assert store.load(rec.id) == rec
    assert rec.summary() == {"recording_id": rec.id, "status": "recording", "owner": "mcp:1",
                             "capture_id": CAPTURE_ID, "pcap_path": f"capture:{rec.id}",
                             "ports": ["/dev/usb-modem0", "/dev/ttyS1"], "execution_id": EXECUTION_ID,
                             "started_at": 100.0, "stopped_at": None}


@pytest.mark.parametrize("args", [{}, {"capture": None}, {"serial_ports": []}, {"bpftrace": {}},
                                  {"serial_settings": {"baudrate": 1}}, {"capture": {}}])
async def test_a_recording_of_nothing_is_refused_before_anything_starts(tmp_path: Path, args: dict[str, Any]) -> None:
    tools = Tools()
    with pytest.raises(DiagdError) as refused:
        await start(tools, RecordingStore(tmp_path), "mcp:1", args, keep=5)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert refused.value.message == "a recording needs at least one of capture, serial_ports, bpftrace"
    assert tools.calls == [] and not (tmp_path / "recordings").exists()


async def test_a_client_without_a_parts_group_starts_nothing(tmp_path: Path) -> None:
    tools = Tools()
    with pytest.raises(DiagdError) as refused:
        await start(tools, RecordingStore(tmp_path), "mcp:1", ALL_PARTS, keep=5,
                    groups=frozenset({"diagd", "capture", "pcap", "serial"}))
    assert refused.value.code == ErrorCode.PERMISSION_DENIED and refused.value.details["missing"] == ["bpftrace"]
    assert tools.calls == [] and not (tmp_path / "recordings").exists()


@pytest.mark.parametrize(("failing", "name", "before", "rollback"), [
    ("start_capture", "capture", [], []),
    ("exec_program", "bpftrace", ["start_capture"], [("stop_capture", {"capture_id": CAPTURE_ID})]),
    ("configure_connection", "serial_ports", ["start_capture", "exec_program"],
     [("stop_capture", {"capture_id": CAPTURE_ID}), ("stop_execution", {"execution_id": EXECUTION_ID})]),
])
async def test_a_failed_part_stops_what_started_and_leaves_no_record(
        tmp_path: Path, failing: str, name: str, before: list[str], rollback: list[tuple[str, dict[str, Any]]]) -> None:
    error = DiagdError(ErrorCode.NOT_FOUND, "no such thing", path="$.interfaces")
    tools, store = Tools({failing: error}), RecordingStore(tmp_path)
    with pytest.raises(DiagdError) as raised:
        await start(tools, store, "mcp:1", ALL_PARTS, keep=5)
    # the part's own error, saying which part
    assert raised.value.code == ErrorCode.NOT_FOUND
    assert raised.value.message == f"{name} ({failing}): no such thing"
    assert raised.value.details == {"path": "$.interfaces", "part": name}
    assert tools.tools()[:len(before) + 1] == [*before, failing]
    assert tools.calls[len(before) + 1:] == rollback
    assert list((tmp_path / "recordings").glob("*")) == [] and list((tmp_path / "exports").glob("*")) == []


async def test_a_failed_port_closes_the_ports_the_recording_opened_even_when_a_stop_fails(tmp_path: Path) -> None:
    tools = Tools({"stop_capture": DiagdError(ErrorCode.NOT_FOUND, "gone")})
    answers = iter([{"port": "/dev/ttyUSB0", "outcome": "opened"}, {"port": "/dev/ttyS1", "outcome": "already_open"}])
    inner = tools.__call__

    async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
        if tool == "configure_connection" and "action" not in args:
            tools.calls.append((tool, args))
            answer = next(answers, None)
            if answer is None:
                raise DiagdError(ErrorCode.BUSY, "port taken")
            return answer
        return await inner(tool, args)

    args = {"capture": {"interfaces": ["veth0"]}, "serial_ports": ["/dev/ttyUSB0", "/dev/ttyS1", "/dev/ttyS2"]}
    with pytest.raises(DiagdError) as raised:
        await start(call, RecordingStore(tmp_path), "mcp:1", args, keep=5)
    assert raised.value.code == ErrorCode.BUSY and raised.value.details["part"] == "serial_ports"
    assert tools.calls[-2:] == [("stop_capture", {"capture_id": CAPTURE_ID}),
                                ("configure_connection", {"port": "/dev/ttyUSB0", "action": "close"})]


async def test_stop_gathers_the_bundle(tmp_path: Path, clock: object) -> None:
    tools, store = Tools(), RecordingStore(tmp_path)
    rec = await start(tools, store, "mcp:1", ALL_PARTS, keep=5)
    tools.calls.clear()
    bundle = await stop(tools, store, rec, timeline_limit=2)
    sources = [{"pcap": f"capture:{CAPTURE_ID}", "label": "capture"}, {"bpftrace": EXECUTION_ID, "label": "bpftrace"},
               {"serial": "/dev/usb-modem0", "label": "serial:/dev/usb-modem0"},
               {"serial": "/dev/ttyS1", "label": "serial:/dev/ttyS1"}]
    window = {"sources": sources, "start": rec.created_at, "end": 101.0}
    stem0, stem1 = f"{rec.id}-usb-modem0", f"{rec.id}-ttyS1"
    assert tools.calls == [
        ("stop_capture", {"capture_id": CAPTURE_ID}),
        ("stop_execution", {"execution_id": EXECUTION_ID}),
        ("get_result", {"execution_id": EXECUTION_ID, "until": "done", "wait_s": 10, "limit": 10000}),
        ("export_serial_pcapng", {"port": "/dev/usb-modem0", "name": stem0}),
        ("export_serial_pcapng", {"port": "/dev/ttyS1", "name": stem1}),
        ("diagd_timeline", {**window, "limit": 2000}),
        ("configure_connection", {"port": "/dev/usb-modem0", "action": "close"})]  # only the one it opened
    folder = tmp_path / "exports" / rec.id
    assert bundle == {
        "recording_id": rec.id, "status": "stopped", "owner": "mcp:1", "capture_id": CAPTURE_ID,
        "pcap_path": f"capture:{rec.id}", "ports": ["/dev/usb-modem0", "/dev/ttyS1"], "execution_id": EXECUTION_ID,
        "started_at": 100.0, "stopped_at": 101.0,
        # the capture's counters and drops as stop_capture answered, read as capture:<recording id>
        "capture": {"capture_id": CAPTURE_ID, "status": "stopped", "stop_reason": "requested", "packets": 44,
                    "drops": STOPPED_CAPTURE["drops"], "files": STOPPED_CAPTURE["files"], "interfaces": ["veth0"],
                    "filter": "sctp", "pcap_path": f"capture:{rec.id}"},
        "bpftrace": {"execution_id": EXECUTION_ID, "status": "stopped", "lines_total": 3,
                     "output_path": str(folder / "bpftrace.txt"), "output_cut": False,
                     "first_lines": ["marker 16842", '{"@count": 2}', "last"]},
        "serial": [{"port": "/dev/usb-modem0", "pcapng_path": f"/s/serial/exports/{stem0}.pcapng", "packets": 4},
                   {"port": "/dev/ttyS1", "pcapng_path": f"/s/serial/exports/{stem1}.pcapng", "packets": 4}],
        "timeline": {"rows": [{"n": 0}, {"n": 1}], "total": 13,
                     "sources": ["capture", "bpftrace", "serial:/dev/usb-modem0", "serial:/dev/ttyS1"],
                     "span": {"first": 1, "last": 2}, "path": str(folder / "timeline.json"), "kept": 3,
                     "hint": "diagd_timeline with these sources (and offset) pages the rest", "query": window}}
    assert (folder / "bpftrace.txt").read_text() == 'marker 16842\n{"@count": 2}\nlast\n'
    assert json.loads((folder / "bundle.json").read_text()) == bundle
    assert (folder / "bundle.json").read_text().count("\n") > 20  # indented for a reader
    assert json.loads((folder / "timeline.json").read_text())["total"] == 13
    again = store.load(rec.id)
    assert (again.status, again.bundle, again.stopped_at) == ("stopped", bundle, 101.0)


async def test_a_capture_only_recording_and_a_long_output(tmp_path: Path, clock: object) -> None:
    tools, store = Tools(output=[f"line {n}" for n in range(25)], has_more=True, rows=0), RecordingStore(tmp_path)
    rec = await start(tools, store, "cli:7", {"capture": {"interfaces": ["veth0"]}}, keep=5)
    assert rec.summary()["pcap_path"] == f"capture:{rec.id}" and rec.ports == [] and rec.execution_id is None
    bundle = await stop(tools, store, rec, timeline_limit=100)
    assert "bpftrace" not in bundle and "serial" not in bundle
    assert bundle["timeline"]["query"]["sources"] == [{"pcap": f"capture:{CAPTURE_ID}", "label": "capture"}]
    assert bundle["timeline"]["kept"] == 0 and bundle["timeline"]["rows"] == []
    assert tools.tools()[-2:] == ["stop_capture", "diagd_timeline"]

    rec2 = await start(tools, store, "cli:7", {"bpftrace": {"program": "BEGIN {}"}}, keep=5)
    assert rec2.summary()["pcap_path"] is None and rec2.capture_id is None
    bundle2 = await stop(tools, store, rec2, timeline_limit=100)
    assert "capture" not in bundle2
    assert bundle2["bpftrace"]["output_cut"] is True
    assert bundle2["bpftrace"]["first_lines"] == [f"line {n}" for n in range(20)]
    assert Path(bundle2["bpftrace"]["output_path"]).read_text() == "".join(f"line {n}\n" for n in range(25))


async def test_a_port_name_becomes_a_stem_without_dots(tmp_path: Path) -> None:
    tools, store = Tools(), RecordingStore(tmp_path)
    rec = Recording(id="rec-0000abcd", owner="mcp:1", dir=str(store.data_dir / "rec-0000abcd"),
                    ports=["/dev/pts/ttyUSB0.1 x"], status="recording")
    store.data_dir.mkdir(parents=True)
    Path(rec.dir).mkdir()
    store.meta_dir.mkdir(parents=True)
    await stop(tools, store, rec, timeline_limit=1)
    assert ("export_serial_pcapng", {"port": "/dev/pts/ttyUSB0.1 x", "name": "rec-0000abcd-ttyUSB0_1_x"}) in tools.calls


async def test_a_stop_that_fails_is_raised(tmp_path: Path) -> None:
    tools, store = Tools(), RecordingStore(tmp_path)
    rec = await start(tools, store, "mcp:1", {"capture": {"interfaces": ["veth0"]}, "bpftrace": {"p": 1}}, keep=5)
    tools.fail["stop_capture"] = DiagdError(ErrorCode.TIMEOUT, "slow")
    with pytest.raises(DiagdError) as raised:
        await stop(tools, store, rec, timeline_limit=1)
    assert raised.value.code == ErrorCode.TIMEOUT and raised.value.message == "slow"
    assert "stop_execution" not in tools.tools()
    assert rec.status == "stopping" and rec.bundle is None
    assert store.load(rec.id).status == "recording"  # nothing saved of a stop that failed


# -- the store -----------------------------------------------------------------------------------------


def test_the_store_keeps_records_by_id(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    assert (store.meta_dir, store.data_dir) == (tmp_path / "recordings", tmp_path / "exports")
    rec = store.new("mcp:1")
    assert re.fullmatch(r"rec-[0-9a-f]{8}", rec.id) and Path(rec.dir) == tmp_path / "exports" / rec.id
    store.save(rec)
    assert store.path(rec.id) == tmp_path / "recordings" / f"{rec.id}.json"
    assert store.load(rec.id) == rec and not list(store.meta_dir.glob("*.tmp"))
    # a field a newer daemon wrote is ignored
    data = json.loads(store.path(rec.id).read_text())
    store.path(rec.id).write_text(json.dumps({**data, "future": 1}))
    assert store.load(rec.id) == rec
    path = store.write(rec, "note.txt", "hello\n")
    assert path == str(Path(rec.dir) / "note.txt") and Path(path).read_text() == "hello\n"
    assert store.write(rec, "note.txt", "x") == path and Path(path).read_text() == "x"  # replaced whole
    store.forget(rec)
    assert not Path(rec.dir).exists() and not store.path(rec.id).exists()
    with pytest.raises(DiagdError) as missing:
        store.load(rec.id)
    assert missing.value.code == ErrorCode.NOT_FOUND and missing.value.message == f"no recording {rec.id!r}"
    assert missing.value.details == {
        "hint": "diagd_record_start returns the recording_id (a recording is seen by its owner)"}
    store.forget(rec)  # twice: nothing left, no error


@pytest.mark.parametrize("bad", ["rec-1234567", "rec-123456789", "rec-ABCDEF12", "cap-00000000", "../rec-00000000",
                                 "rec-00000000\n", "", "rec-0000000g"])
def test_a_recording_id_is_rec_and_8_hex_digits(tmp_path: Path, bad: str) -> None:
    with pytest.raises(DiagdError) as refused:
        RecordingStore(tmp_path).path(bad)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert refused.value.message == f"not a recording id: {bad!r}"
    assert refused.value.details == {"hint": "recording ids look like rec-1a2b3c4d (diagd_record_start)"}


def test_new_recording_ids_are_fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RecordingStore(tmp_path)
    store.meta_dir.mkdir(parents=True)
    (store.meta_dir / "rec-00000001.json").write_text("{}")
    (store.data_dir / "rec-00000002").mkdir(parents=True)
    drawn = iter(["00000001", "00000002", "00000003"])
    monkeypatch.setattr(recording.secrets, "token_hex", lambda n: next(drawn) if n == 4 else "wrong size")
    rec = store.new("http:agent")
    assert (rec.id, rec.owner, rec.status) == ("rec-00000003", "http:agent", "recording")


def test_prune_keeps_the_newest_stopped_recordings(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    assert store.prune(1) == []  # no folder yet
    made = {}
    for n, (status, created) in enumerate([("stopped", 5.0), ("stopped", 1.0), ("recording", 0.5), ("stopped", 3.0),
                                           ("stopping", 0.1), ("stopped", 4.0)]):
        rec = Recording(id=f"rec-0000000{n}", owner="mcp:1", dir=str(store.data_dir / f"rec-0000000{n}"),
                        created_at=created, status=status)
        Path(rec.dir).mkdir(parents=True)
        store.meta_dir.mkdir(exist_ok=True)
        store.save(rec)
        made[rec.id] = rec
    (store.meta_dir / "rec-0000000f.json").write_text("{broken")
    (store.meta_dir / "rec-0000000e.json").write_text('{"owner": "x"}')  # id and dir missing
    assert store.prune(2) == ["rec-00000001", "rec-00000003"]  # the oldest stopped ones
    left = sorted(p.stem for p in store.meta_dir.glob("rec-*.json"))
    assert left == ["rec-00000000", "rec-00000002", "rec-00000004", "rec-00000005", "rec-0000000e", "rec-0000000f"]
    assert not Path(made["rec-00000001"].dir).exists() and Path(made["rec-00000005"].dir).exists()
    assert store.prune(2) == []
    assert store.prune(0) == ["rec-00000005", "rec-00000000"]


async def test_start_prunes_with_keep(tmp_path: Path) -> None:
    store = RecordingStore(tmp_path)
    for n in range(3):
        rec = Recording(id=f"rec-0000000{n}", owner="mcp:1", dir=str(store.data_dir / f"rec-0000000{n}"),
                        created_at=float(n), status="stopped")
        Path(rec.dir).mkdir(parents=True)
        store.meta_dir.mkdir(exist_ok=True)
        store.save(rec)
    made = await start(Tools(), store, "mcp:1", {"capture": {"interfaces": ["x"]}}, keep=1)
    assert sorted(p.stem for p in store.meta_dir.glob("rec-*.json")) == sorted(["rec-00000002", made.id])


async def test_a_serial_only_recording_starts(tmp_path: Path) -> None:
    tools = Tools()
    rec = await start(tools, RecordingStore(tmp_path), "mcp:1", {"serial_ports": ["/dev/ttyUSB0"]}, keep=5,
                      groups=frozenset({"diagd", "capture", "serial"}))
    assert tools.calls == [("configure_connection", {"port": "/dev/ttyUSB0"})]
    assert (rec.ports, rec.opened_ports, rec.capture_id, rec.execution_id) == (["/dev/ttyUSB0"], ["/dev/ttyUSB0"],
                                                                               None, None)


async def test_a_start_cancelled_half_way_still_stops_what_started(tmp_path: Path) -> None:
    """The rollback is shielded: a client that goes away during the start leaves no capture running."""
    tools, store = Tools(), RecordingStore(tmp_path)
    started = trio.Event()

    async def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if tool == "exec_program":
            started.set()
            await trio.sleep_forever()
        return await tools(tool, args)

    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: start(call, store, "mcp:1", ALL_PARTS, keep=5))
            await started.wait()
            scope.cancel()
    assert tools.calls == [("start_capture", {"interfaces": ["veth0"], "filter": "sctp"}),
                           ("stop_capture", {"capture_id": CAPTURE_ID})]
    assert list((tmp_path / "recordings").glob("*")) == [] and list((tmp_path / "exports").glob("*")) == []


async def test_start_stop_and_a_failed_rollback_are_logged(tmp_path: Path) -> None:
    tools, store = Tools({"stop_capture": DiagdError(ErrorCode.NOT_FOUND, "gone")}), RecordingStore(tmp_path)
    with structlog.testing.capture_logs() as logs:
        rec = await start(tools, store, "mcp:1", {"serial_ports": ["/dev/ttyUSB0"]}, keep=5)
        await stop(tools, store, rec, timeline_limit=1)
        tools.fail["exec_program"] = DiagdError(ErrorCode.INVALID_ARGUMENT, "bad program")
        with pytest.raises(DiagdError):
            await start(tools, store, "mcp:1", {"capture": {"interfaces": ["x"]}, "bpftrace": {"p": 1}}, keep=5)
    started = [e for e in logs if e["event"] == "recording started"]
    assert len(started) == 1 and started[0]["recording_id"] == rec.id and started[0]["ports"] == ["/dev/ttyUSB0"]
    assert [e["recording_id"] for e in logs if e["event"] == "recording stopped"] == [rec.id]
    failed = [e for e in logs if e["event"] == "a recording's part did not stop"]
    assert len(failed) == 1 and failed[0]["log_level"] == "warning"
    assert (failed[0]["tool"], failed[0]["error"]) == ("stop_capture", "gone")
    assert re.fullmatch(r"rec-[0-9a-f]{8}", failed[0]["recording_id"]) and failed[0]["recording_id"] != rec.id
