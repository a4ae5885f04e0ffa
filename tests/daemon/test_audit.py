"""Audit log rotation and call statistics."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from diagd.daemon.audit import AuditLog, CallStats, percentile
from diagd.daemon.tools import CallRecord
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
    monkeypatch.setattr("diagd.daemon.audit.os.replace", replace_then_plant)
    for _ in range(20):  # past the rotation: the writes after it are dropped, none raises
        log.write(record())
    log.close()
    assert not target.exists() and path.is_symlink()
