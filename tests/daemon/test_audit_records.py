"""The audit log and the call statistics, read back from outside against what docs/configuration.md
and docs/operations.md say: each line is one JSON object with the call's fields (checked one by one
against the record written), the file rotates past `audit_max_bytes` keeping `audit_keep` older files
(a model of the rotation says which record is in which file), everything is owner-only; the
statistics count, fail, cancel and time calls per tool (p50/p95 by nearest rank, written out here),
keep the latest calls within their bounds and list the running ones with their time so far."""

from __future__ import annotations

import json
import os
import random
import stat
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from diagd.daemon.server import audit
from diagd.daemon.server.audit import AuditLog, CallRecord, CallStats, log_call, percentile

FIELDS = ["ts", "client", "tool", "arguments", "duration_ms", "queue_ms", "outcome", "code", "bytes", "truncated"]


def rec(seq: int = 0, *, tool: str = "t", outcome: str = "ok", duration_ms: float = 1.0, args: Any = None,
        call_id: str | None = None, details: dict[str, Any] | None = None, ts: float = 0.0,
        client: str = "mcp:1") -> CallRecord:
    return CallRecord(ts=ts, client=client, tool=tool, arguments={"seq": seq} if args is None else args,
                      duration_ms=duration_ms, queue_ms=0.25 * seq, outcome=outcome,
                      code=None if outcome in ("ok", "started") else "TIMEOUT", bytes=7 * seq,
                      truncated=seq % 2 == 1, call_id=call_id, details=details)


def expected_line(r: CallRecord) -> dict[str, Any]:
    """The documented fields, from the record's own attributes; call_id and details only when set."""
    line = {"ts": r.ts, "client": r.client, "tool": r.tool, "arguments": r.arguments, "duration_ms": r.duration_ms,
            "queue_ms": r.queue_ms, "outcome": r.outcome, "code": r.code, "bytes": r.bytes,
            "truncated": r.truncated}
    if r.call_id is not None:
        line["call_id"] = r.call_id
    if r.details is not None:
        line["details"] = r.details
    return line


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="ascii").splitlines()]


def test_each_line_is_the_calls_fields_one_by_one(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, keep=2)
    written = [
        rec(1, tool="pcap_open", outcome="started", duration_ms=0.0, call_id="c1-1", ts=1700000000.25,
            args={"path": "/tmp/x.pcap", "n": [1, 2.5, None, True]}),
        rec(1, tool="pcap_open", outcome="ok", duration_ms=12.345, call_id="c1-1", ts=1700000000.5),
        rec(2, tool="nope", outcome="error", duration_ms=0.0, call_id="c1-2",
            details={"jsonrpc_code": -32602, "did_you_mean": ["pcap_open"]}),
        rec(3, outcome="cancelled", duration_ms=30000.0, client="http:laptop"),
    ]
    for r in written:
        log.write(r)
    log.close()
    got = lines(tmp_path / "audit.jsonl")
    assert len(got) == 4
    for line, r in zip(got, written, strict=True):
        assert list(line)[:10] == FIELDS
        assert line == expected_line(r)
    assert got[0]["arguments"] == {"path": "/tmp/x.pcap", "n": [1, 2.5, None, True]}
    assert (got[1]["tool"], got[1]["outcome"], got[1]["duration_ms"], got[1]["code"]) == (
        "pcap_open", "ok", 12.345, None)
    assert (got[2]["code"], got[2]["details"]["jsonrpc_code"]) == ("TIMEOUT", -32602)
    assert "call_id" not in got[3] and "details" not in got[3] and got[3]["client"] == "http:laptop"
    assert (got[3]["queue_ms"], got[3]["bytes"], got[3]["truncated"]) == (0.75, 21, True)


def test_a_line_is_compact_ascii_and_other_values_are_written_as_text(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, keep=2)
    log.write(rec(args={"path": Path("/srv/caf\u00e9"), "q": "\u2028\u00e9"}))
    log.close()
    raw = (tmp_path / "audit.jsonl").read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 1 and raw.endswith(b"\n")
    assert b", " not in raw and b": " not in raw
    assert json.loads(raw)["arguments"] == {"path": "/srv/caf\u00e9", "q": "\u2028\u00e9"}


def test_to_json_is_the_documented_shape() -> None:
    r = rec(4, call_id=None)
    assert r.to_json() == expected_line(r) and list(r.to_json()) == FIELDS
    r = rec(5, call_id="x-5", details={"a": 1})
    assert r.to_json() == {**expected_line(rec(5)), "call_id": "x-5", "details": {"a": 1}}
    assert rec(6, details={}).to_json()["details"] == {}  # set, even empty


def test_the_daemon_log_line_of_a_call_names_its_fields() -> None:
    r = rec(3, tool="serial_send", outcome="error", duration_ms=4.5, client="cli:9")
    with structlog.testing.capture_logs() as logged:
        log_call(r)
    assert logged == [{"event": "tool call", "log_level": "info", "tool": "serial_send", "client": "cli:9",
                       "outcome": "error", "code": "TIMEOUT", "duration_ms": 4.5, "queue_ms": 0.75, "bytes": 21}]


class RotationModel:
    """audit.jsonl and audit.jsonl.1..keep: the current file is rotated once a write leaves it at or past
    max_bytes; .i moves to .i+1, the oldest beyond .keep is gone."""

    def __init__(self, max_bytes: int, keep: int, existing: int = 0) -> None:
        self.max_bytes, self.keep = max_bytes, keep
        self.files: list[list[int]] = [[]]  # [current, .1, .2, ...]
        self.size = existing

    def write(self, seq: int, size: int) -> None:
        self.files[0].append(seq)
        self.size += size
        if self.size >= self.max_bytes:
            self.files = [[], *self.files][: self.keep + 1]
            self.size = 0


@pytest.mark.parametrize(("max_bytes", "keep", "seed"), [(200, 1, 1), (200, 2, 2), (333, 3, 3), (1000, 4, 4),
                                                          (60, 2, 5)])
def test_rotation_keeps_each_record_in_the_file_a_model_says(tmp_path: Path, max_bytes: int, keep: int,
                                                             seed: int) -> None:
    rng = random.Random(seed)
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, max_bytes=max_bytes, keep=keep)
    model = RotationModel(max_bytes, keep)
    for seq in range(120):
        r = rec(seq, args={"seq": seq, "pad": "x" * rng.randrange(0, 90)})
        log.write(r)
        model.write(seq, len(json.dumps(expected_line(r), separators=(",", ":"))) + 1)
    log.close()
    names = [path.name] + [f"{path.name}.{i}" for i in range(1, keep + 1)]
    for name, seqs in zip(names, model.files + [[]] * (keep + 1 - len(model.files)), strict=True):
        if not seqs and not (tmp_path / name).exists():
            continue
        assert [line["arguments"]["seq"] for line in lines(tmp_path / name)] == seqs, name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[: len(model.files)])


def test_the_size_that_rotates_is_exactly_max_bytes_and_counts_what_was_there(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    size = len(json.dumps(expected_line(rec(1)), separators=(",", ":"))) + 1
    log = AuditLog(path, max_bytes=size + 1, keep=2)
    log.write(rec(1))
    assert not (tmp_path / "audit.jsonl.1").exists()  # one byte below
    log.write(rec(1))
    assert [len(lines(tmp_path / "audit.jsonl.1"))] == [2] and path.read_text() == ""
    log.close()
    path.write_text("x" * 10 + "\n")  # what an earlier run left
    log = AuditLog(path, max_bytes=size + 11, keep=2)
    log.write(rec(1))
    log.close()
    assert path.read_text() == "" and (tmp_path / "audit.jsonl.1").read_text().startswith("x" * 10 + "\n")
    assert (tmp_path / "audit.jsonl.2").exists()


def test_rotation_over_a_gap_in_the_older_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    (tmp_path / "audit.jsonl.2").write_text('{"old":2}\n')
    (tmp_path / "audit.jsonl.2").chmod(0o600)
    log = AuditLog(path, max_bytes=10, keep=3)
    log.write(rec(1))  # current -> .1, .2 -> .3, no .1 to move
    log.close()
    assert lines(tmp_path / "audit.jsonl.3") == [{"old": 2}]
    assert [r["arguments"]["seq"] for r in lines(tmp_path / "audit.jsonl.1")] == [1]
    assert not (tmp_path / "audit.jsonl.2").exists() and path.read_text() == ""


def test_every_kept_file_is_tightened_at_start_the_last_one_too(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for i in range(1, 5):
        (tmp_path / f"audit.jsonl.{i}").write_text("{}\n")
        (tmp_path / f"audit.jsonl.{i}").chmod(0o644)
    (tmp_path / "audit.jsonl.0").write_text("{}\n")  # no rotation is called .0: not ours either
    (tmp_path / "audit.jsonl.0").chmod(0o644)
    (tmp_path / "audit.jsonl.2").chmod(0o400)  # already owner-only: left as it is
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    elsewhere.chmod(0o644)
    (tmp_path / "audit.jsonl.5").symlink_to(elsewhere)  # never followed
    AuditLog(path, max_bytes=1 << 20, keep=3).close()
    modes = {i: stat.S_IMODE((tmp_path / f"audit.jsonl.{i}").stat().st_mode) for i in range(5)}
    assert modes == {0: 0o644, 1: 0o600, 2: 0o400, 3: 0o600, 4: 0o644}  # .4 is beyond keep: not ours to touch
    AuditLog(path, max_bytes=1 << 20, keep=5).close()
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_fifo_among_the_old_files_does_not_hang_the_start(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "audit.jsonl.1", 0o644)
    AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, keep=2).close()
    assert stat.S_IMODE((tmp_path / "audit.jsonl.1").stat().st_mode) == 0o600


def test_a_log_created_now_is_0600_under_any_umask_and_a_tight_one_is_left_alone(tmp_path: Path) -> None:
    previous = os.umask(0)
    try:
        AuditLog(tmp_path / "a.jsonl", max_bytes=100, keep=1).close()
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.jsonl").stat().st_mode) == 0o600
    (tmp_path / "b.jsonl").write_text("")
    (tmp_path / "b.jsonl").chmod(0o400)
    AuditLog(tmp_path / "b.jsonl", max_bytes=100, keep=1)  # never loosened to 0600
    assert stat.S_IMODE((tmp_path / "b.jsonl").stat().st_mode) == 0o400
    for mode in (0o644, 0o640, 0o604, 0o660):  # left readable by an older diagd: tightened, not rotated
        (tmp_path / "c.jsonl").write_text("{}\n")
        (tmp_path / "c.jsonl").chmod(mode)
        AuditLog(tmp_path / "c.jsonl", max_bytes=100, keep=1).close()
        assert stat.S_IMODE((tmp_path / "c.jsonl").stat().st_mode) == 0o600
        assert (tmp_path / "c.jsonl").read_text() == "{}\n"


def test_a_link_planted_where_the_log_rotates_to_is_one_coded_error_in_the_daemon_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "audit.jsonl"
    real_replace = os.replace

    def replace_then_plant(src: Any, dst: Any) -> None:
        real_replace(src, dst)
        if Path(src) == path:
            path.symlink_to(tmp_path / "elsewhere")

    log = AuditLog(path, max_bytes=10, keep=2)
    monkeypatch.setattr(audit.os, "replace", replace_then_plant)
    with structlog.testing.capture_logs() as logged:
        log.write(rec(1))
        log.write(rec(2))
    log.close()
    assert [(e["event"], e["log_level"], e["code"]) for e in logged] == [
        ("audit log disabled", "error", "PERMISSION_DENIED")]
    assert "symlink" in logged[0]["error"] and str(path) in logged[0]["error"]
    assert not (tmp_path / "elsewhere").exists()


def test_a_disabled_log_closes_quietly(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=100, keep=1)
    log._file = None  # what a refused reopening leaves
    log.write(rec(1))
    log.close()
    assert (tmp_path / "audit.jsonl").read_text() == ""


# -- statistics


def nearest_rank(values: list[float], pct: float) -> float | None:
    """The value at the nearest rank: sorted, the index pct % of the way from first to last (ties to even)."""
    if not values:
        return None
    s = sorted(values)
    return round(s[round(pct * (len(s) - 1) / 100)], 3)


@pytest.mark.parametrize(("values", "p50", "p95"), [
    ([7.0], 7.0, 7.0),
    ([3.0, 1.0, 2.0], 2.0, 3.0),  # index 1 and 1.9 -> 2
    ([4.0, 1.0], 1.0, 4.0),  # 0.5 -> 0 (to even), 0.95 -> 1
    ([1.0, 2.0, 3.0, 4.0], 3.0, 4.0),  # 1.5 -> 2, 2.85 -> 3
    ([float(i) for i in range(1, 22)], 11.0, 20.0),  # 10 and 19
    ([1.23456, 9.87654], 1.235, 9.877),  # rounded to the microsecond
])
def test_percentiles_by_nearest_rank(values: list[float], p50: float, p95: float) -> None:
    assert (percentile(values, 50), percentile(values, 95)) == (p50, p95)
    assert percentile(values, 0) == round(min(values), 3) and percentile(values, 100) == round(max(values), 3)
    assert percentile([], 95) is None


def test_summary_counts_per_tool_sorted_by_name() -> None:
    stats = CallStats()
    for r in [rec(1, tool="b", duration_ms=3.0), rec(2, tool="b", outcome="error", duration_ms=5.0),
              rec(3, tool="b", outcome="cancelled", duration_ms=10.0), rec(4, tool="a", duration_ms=1.0),
              rec(5, tool="c", outcome="started", call_id="x")]:
        stats.observe(r)
    summary = stats.summary()
    assert list(summary) == ["a", "b"] and stats.total == 4 and stats.tool_names() == 2
    assert summary["b"] == {"count": 3, "failures": 1, "cancelled": 1, "failure_rate": 0.3333, "mean_ms": 6.0,
                            "p50_ms": 5.0, "p95_ms": 10.0}
    assert summary["a"] == {"count": 1, "failures": 0, "cancelled": 0, "failure_rate": 0.0, "mean_ms": 1.0,
                            "p50_ms": 1.0, "p95_ms": 1.0}


def test_running_calls_show_their_time_so_far_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = CallStats()
    stats.observe(rec(1, tool="a", outcome="started", call_id="c-1", ts=1000.0))
    stats.observe(rec(2, tool="b", outcome="started", call_id="c-2", ts=1001.5))
    stats.observe(rec(3, tool="c", outcome="started", ts=1002.0))  # no call_id: not followed
    monkeypatch.setattr(audit.time, "time", lambda: 1003.0001234)
    running = stats.running()
    assert [(r.tool, r.call_id, r.outcome, r.duration_ms) for r in running] == [
        ("a", "c-1", "running", 3000.123), ("b", "c-2", "running", 1500.123)]
    assert stats.running_count() == 2 and stats.total == 0
    stats.observe(rec(1, tool="a", call_id="c-1"))
    assert [r.call_id for r in stats.running()] == ["c-2"] and stats.running_count() == 1
    stats.observe(rec(9, tool="b", call_id=None))  # an end without an id leaves the running alone
    assert stats.running_count() == 1 and stats.total == 2
    stats.observe(rec(9, tool="b", call_id="never-started"))  # an end whose start was not seen: counted
    assert stats.running_count() == 1 and stats.total == 3


class StatsModel:
    """Documented bounds: `recent` latest calls and at most `recent_bytes` of their arguments as JSON (the
    oldest go; one is always kept), the latest `samples` durations per tool, `max_tools` names with their
    own entry where the last is shared by every further name."""

    def __init__(self, recent: int, recent_bytes: int, max_tools: int, samples: int) -> None:
        self.recent, self.recent_bytes, self.max_tools, self.samples = recent, recent_bytes, max_tools, samples
        self.ring: list[tuple[CallRecord, int]] = []
        self.tools: dict[str, dict[str, Any]] = {}
        self.total = 0

    def observe(self, r: CallRecord) -> None:
        if r.outcome == "started":
            return
        own = [name for name in self.tools if name != audit.OTHER_TOOLS]
        name = r.tool if r.tool in self.tools or len(own) < self.max_tools - 1 else "(other tool names)"
        t = self.tools.setdefault(name, {"count": 0, "failures": 0, "cancelled": 0, "d": []})
        t["count"] += 1
        t["failures"] += r.outcome == "error"
        t["cancelled"] += r.outcome == "cancelled"
        t["d"] = [*t["d"], r.duration_ms][-self.samples:]
        self.total += 1
        self.ring = [*self.ring, (r, len(json.dumps(r.arguments, separators=(",", ":"))))][-self.recent:]
        while sum(size for _, size in self.ring) > self.recent_bytes and len(self.ring) > 1:
            self.ring.pop(0)

    def summary(self) -> dict[str, Any]:
        return {name: {"count": t["count"], "failures": t["failures"], "cancelled": t["cancelled"],
                       "failure_rate": round(t["failures"] / t["count"], 4),
                       "mean_ms": round(sum(t["d"]) / len(t["d"]), 3),
                       "p50_ms": nearest_rank(t["d"], 50), "p95_ms": nearest_rank(t["d"], 95)}
                for name, t in sorted(self.tools.items())}


@pytest.mark.parametrize(("recent", "recent_bytes", "max_tools", "samples", "seed"),
                         [(5, 60, 3, 4, 1), (8, 1000, 4, 1024, 2), (3, 10, 2, 2, 3), (20, 200, 6, 7, 4)])
def test_statistics_follow_a_model_of_their_documented_bounds(
        monkeypatch: pytest.MonkeyPatch, recent: int, recent_bytes: int, max_tools: int, samples: int,
        seed: int) -> None:
    monkeypatch.setattr(audit, "DURATIONS_PER_TOOL", samples)
    rng = random.Random(seed)
    stats = CallStats(recent=recent, recent_bytes=recent_bytes, max_tools=max_tools)
    model = StatsModel(recent, recent_bytes, max_tools, samples)
    for seq in range(400):
        args = {"p": "x" * rng.choice([0, 1, 5, 20, 40])} if rng.random() < 0.8 else {}
        r = rec(seq, tool=f"tool-{rng.randrange(max_tools + 2)}", args=args,
                outcome=rng.choice(["ok", "ok", "error", "cancelled", "started"]),
                duration_ms=rng.choice([0.5, 1.0, 2.25, 7.0, 100.0, 1.0005]))
        stats.observe(r)
        model.observe(r)
        assert list(stats.recent) == [m for m, _ in model.ring]
        assert stats.recent_bytes == sum(size for _, size in model.ring)
        assert stats.summary() == model.summary() and stats.total == model.total
        assert stats.tool_names() == len(model.tools)


def test_the_documented_default_bounds() -> None:
    stats = CallStats()
    assert stats.recent.maxlen == 500 and stats.max_recent_bytes == 2 * 1024 * 1024 and stats.max_tools == 256
    for i in range(1030):
        stats.observe(rec(tool="t", duration_ms=float(i)))
    assert stats.summary()["t"]["p50_ms"] == nearest_rank([float(i) for i in range(6, 1030)], 50)  # the latest 1,024
    for i in range(300):
        stats.observe(rec(tool=f"n{i}"))
    summary = stats.summary()
    assert len(summary) == 256 and summary["(other tool names)"]["count"] == 300 - 254
    assert len(stats.recent) == 500


async def test_a_call_timed_on_trios_clock_is_audited_with_its_duration(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    # What the registry does around a call, with the call's duration measured on the MockClock.
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, keep=1)
    stats = CallStats()
    start = trio.current_time()
    for r in (rec(1, tool="bpftrace_run", outcome="started", duration_ms=0.0, call_id="k-1"),):
        log.write(r)
        stats.observe(r)
    await trio.sleep(2.5)
    end = rec(1, tool="bpftrace_run", outcome="error", duration_ms=round((trio.current_time() - start) * 1000, 3),
              call_id="k-1")
    log.write(end)
    stats.observe(end)
    log.close()
    first, last = lines(tmp_path / "audit.jsonl")
    assert (first["outcome"], first["duration_ms"], first["call_id"]) == ("started", 0.0, "k-1")
    assert (last["tool"], last["outcome"], last["duration_ms"], last["code"], last["call_id"]) == (
        "bpftrace_run", "error", 2500.0, "TIMEOUT", "k-1")
    assert stats.summary()["bpftrace_run"]["mean_ms"] == 2500.0 and stats.running() == []
