"""Audit log rotation and call statistics."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from diagd.daemon.server.audit import AuditLog, CallStats, percentile
from diagd.daemon.server.tools import CallRecord
from diagd.protocol.errors import DiagdError, ErrorCode


def record(tool: str = "t", duration_ms: float = 1.0, outcome: str = "ok") -> CallRecord:
    return CallRecord(ts=0.0, client="c", tool=tool, arguments={"a": 1}, duration_ms=duration_ms, queue_ms=0.0,
                      outcome=outcome, code=None if outcome == "ok" else "TIMEOUT", bytes=10, truncated=False)


def test_audit_lines_are_json_with_every_field(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, keep=2)
    log.write(record())
    log.close()
    line = json.loads((tmp_path / "audit.jsonl").read_text())
    assert set(line) == {"ts", "client", "tool", "arguments", "duration_ms", "queue_ms", "outcome", "code",
                         "bytes", "truncated"}


def test_audit_log_rotates_and_keeps_a_bounded_number_of_files(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=500, keep=2)
    for _ in range(40):
        log.write(record())
    log.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    assert all(p.stat().st_size < 800 for p in tmp_path.iterdir())


def test_stats_count_failures_and_percentiles() -> None:
    stats = CallStats()
    for ms in range(1, 101):
        stats.observe(record(duration_ms=float(ms)))
    stats.observe(record(outcome="error", duration_ms=5))
    summary = stats.summary()["t"]
    assert summary["count"] == 101 and summary["failures"] == 1
    assert summary["p50_ms"] == 50 and summary["p95_ms"] == 95
    assert summary["mean_ms"] == round((sum(range(1, 101)) + 5) / 101, 3)  # the mean beside p50/p95
    assert percentile([], 50) is None


def test_every_record_is_one_line_whatever_the_arguments_hold(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, keep=2)
    odd = "a\u2028b\u2029c\x85d\x1ee\x1cf\ud800g"
    log.write(CallRecord(ts=1.0, client="mcp:1", tool="t", arguments={"q": odd}, duration_ms=0.0, queue_ms=0.0,
                         outcome="ok", code=None, bytes=0, truncated=False))
    log.close()
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["arguments"]["q"] == odd


def test_the_audit_log_and_its_rotations_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    # An older diagd left them world-readable; every call's arguments are in there.
    for name in ("audit.jsonl", "audit.jsonl.1"):
        (tmp_path / name).write_text("{}\n")
        (tmp_path / name).chmod(0o644)
    previous = os.umask(0)  # the worst umask a daemon could inherit
    try:
        log = AuditLog(tmp_path / "audit.jsonl", max_bytes=500, keep=3)
        for _ in range(40):
            log.write(record())
        log.close()
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"audit.jsonl": 0o600, "audit.jsonl.1": 0o600, "audit.jsonl.2": 0o600, "audit.jsonl.3": 0o600}


def test_the_audit_log_is_never_written_through_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "audit.jsonl").symlink_to(target)
    with pytest.raises(DiagdError) as refused:  # coded: `diagd serve` says it in one line (issue 20)
        AuditLog(tmp_path / "audit.jsonl", max_bytes=500, keep=3)
    assert refused.value.code == ErrorCode.PERMISSION_DENIED and "symlink" in refused.value.message
    assert target.read_text() == ""


def test_a_link_planted_where_the_log_rotates_to_disables_it_instead_of_writing_through_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The link appears between the rename and the new file's creation (the race, made certain)."""
    target = tmp_path / "elsewhere"
    path = tmp_path / "audit.jsonl"
    real_replace = os.replace

    def replace_then_plant(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        real_replace(src, dst)
        if Path(src) == path:
            path.symlink_to(target)

    log = AuditLog(path, max_bytes=500, keep=2)
    monkeypatch.setattr("diagd.daemon.server.audit.os.replace", replace_then_plant)
    for _ in range(20):  # past the rotation: the writes after it are dropped, none raises
        log.write(record())
    log.close()
    assert not target.exists() and path.is_symlink()


# -- what the statistics keep is bounded whatever the clients send (issue 28: a daemon runs for weeks)


def test_recent_calls_are_bounded_in_entries() -> None:
    stats = CallStats(recent=50)
    for i in range(10_000):
        stats.observe(record(duration_ms=float(i)))
    assert len(stats.recent) == 50 and stats.total == 10_000
    assert [r.duration_ms for r in stats.recent] == [float(i) for i in range(9_950, 10_000)]  # the latest
    assert stats.recent_bytes == 50 * len('{"a":1}')


def test_recent_calls_are_bounded_in_bytes_of_their_arguments() -> None:
    stats = CallStats(recent=500, recent_bytes=100_000)
    big = {"q": "x" * 1000, "items": ["y" * 1000] * 100}  # ~100 kB as JSON: audit abridging leaves it so
    for _ in range(200):
        stats.observe(CallRecord(ts=0.0, client="c", tool="t", arguments=big, duration_ms=1.0, queue_ms=0.0,
                                 outcome="ok", code=None, bytes=0, truncated=False))
    assert stats.recent_bytes <= 100_000 or len(stats.recent) == 1  # one record is kept even when over
    assert stats.recent_bytes == sum(len(json.dumps(r.arguments, separators=(",", ":"))) for r in stats.recent)
    for _ in range(600):  # small ones again: the byte count follows what the ring holds
        stats.observe(record())
    assert len(stats.recent) == 500 and stats.recent_bytes == 500 * len('{"a":1}')


def test_latency_samples_per_tool_are_bounded() -> None:
    stats = CallStats()
    for i in range(5000):
        stats.observe(record(duration_ms=float(i)))
    assert stats.summary()["t"]["count"] == 5000
    assert stats.summary()["t"]["p50_ms"] >= 5000 - 1024  # the latest 1024 samples only


def test_invented_tool_names_share_one_entry_past_the_cap() -> None:
    stats = CallStats(max_tools=8)
    for i in range(1000):
        stats.observe(record(tool=f"no-such-tool-{i}", outcome="error"))
    summary = stats.summary()
    assert stats.tool_names() == 8 and len(summary) == 8
    assert summary["(other tool names)"]["count"] == 1000 - 7
    stats.observe(record(tool="no-such-tool-3"))  # a name that has its own entry keeps it
    assert stats.summary()["no-such-tool-3"]["count"] == 2


def test_running_calls_leave_when_they_end() -> None:
    stats = CallStats()
    for i in range(100):
        start = record(outcome="started")
        start.call_id = f"c-{i}"
        stats.observe(start)
    assert stats.running_count() == 100
    for i in range(100):
        end = record()
        end.call_id = f"c-{i}"
        stats.observe(end)
    assert stats.running_count() == 0 and stats.running() == []
