"""crash's kernel-log timeline adapter on built `log` / `log -T` lines: a boot date read from ctime text
whatever the day of the month (crash pads a one-digit day with a space: `Sun Dec  6`)."""

from __future__ import annotations

import calendar
import time

import pytest

from diagd.actors.crash.timeline_source import boot_epoch


def ctime_line(epoch: int, text: str) -> str:
    """`log -T`'s prefix as crash prints it: ctime's text, the day padded with a space, in UTC."""
    parts = time.gmtime(epoch)
    day = f"{parts.tm_mday:2d}"
    stamp = time.strftime(f"%a %b {day} %H:%M:%S UTC %Y", parts)
    return f"[{stamp}] {text}"


@pytest.mark.parametrize("date", ["2026-12-06", "2026-12-10", "2027-01-01", "2026-02-28"])
def test_boot_date_is_read_on_every_day_of_the_month(date: str) -> None:
    boot = calendar.timegm(time.strptime(f"{date} 03:20:02", "%Y-%m-%d %H:%M:%S"))
    uptimes = [0.000000, 1.250000, 59.999999, 3601.5]
    relative = [f"[{u:12.6f}] line {n}" for n, u in enumerate(uptimes)]
    walls = [ctime_line(boot + int(u), f"line {n}") for n, u in enumerate(uptimes)]
    if date.endswith("-06"):
        assert "Dec  6" in walls[0]  # the case that failed: a space-padded day
    assert boot_epoch(relative, walls) == boot


def test_boot_date_is_none_when_the_outputs_do_not_pair() -> None:
    boot = calendar.timegm(time.strptime("2026-12-06 03:20:02", "%Y-%m-%d %H:%M:%S"))
    relative = ["[    1.000000] a", "[    2.000000] b"]
    assert boot_epoch(relative, [ctime_line(boot + 1, "a"), ctime_line(boot + 2, "other")]) is None
    assert boot_epoch(relative, [ctime_line(boot + 1, "a"), ctime_line(boot + 5, "b")]) is None
