"""diagd_timeline's merge on scripted back-end answers: order, offsets, windows, caps, errors.

The sources are read by the adapters the back ends declare (each one's timeline_source.SOURCE); the
same tools' real answers are checked end to end in tests/e2e/test_timeline.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from diagd.actors import timeline_source
from diagd.daemon.server import timeline
from diagd.protocol.errors import DiagdError, ErrorCode
from tests import backends

# Every back end's adapter (Scripted answers the tools of pcap's, serial's, bpftrace's and crash's).
ADAPTERS = backends.timeline_sources()


class Scripted:
    """A Caller that answers pcap_timeline, get_log, get_result and crash commands from fixed data."""

    def __init__(self, *, frames: int = 3, serial: int = 3, bpf: int = 2, log: list[str] | None = None,
                 ctime: list[str] | None = None, times: bool = True) -> None:
        self.frames = [{"frame.number": n + 1, "frame.time_epoch": f"{100 + n:.9f}", "_ws.col.Info": f"f{n + 1}"}
                       for n in range(frames)]
        self.serial = [{"i": i, "ts": 100.5 + i, "dir": "rx", "data": f"s{i}", "format": "text", "bytes": 2}
                       for i in range(serial)]
        self.bpf = [f"b{i}" for i in range(bpf)]
        self.bpf_times = [100.25 + i for i in range(bpf)] if times else None
        self.log = log or []
        self.ctime = ctime or []
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((name, args))
        if name == "pcap_timeline":
            rows = self.frames[:args["limit"]]
            return {"rows": rows, "total": len(self.frames), "has_more": len(self.frames) > args["limit"]}
        if name == "get_log":
            if args["port"] == "/dev/none":
                raise DiagdError(ErrorCode.NOT_FOUND, "no raw log for /dev/none")
            page = self.serial[args["offset"]:args["offset"] + args["limit"]]
            end = args["offset"] + len(page)
            return {"records": page, "log_file": "x.jsonl", "next_offset": end if end < len(self.serial) else None}
        if name == "get_result":
            return {"output": self.bpf, "line_ts": self.bpf_times, "has_more": False, "next_offset": len(self.bpf),
                    "status": "completed"}
        if name == "run_crash_command":
            lines = self.log if args["command"] == "log" else self.ctime
            return {"output": "\n".join(lines), "total_lines": len(lines), "lines_returned": len(lines),
                    "command_id": args["command"]}
        raise AssertionError(name)


async def build(call: timeline_source.Caller, sources: list[Any], **kwargs: Any) -> dict[str, Any]:
    return await timeline.build(call, ADAPTERS, sources, **kwargs)


SOURCES = [{"pcap": "/x/core.pcap", "fields": ["_ws.col.Info"]}, {"serial": "/dev/ttyUSB0"}, {"bpftrace": "bt-1"}]


async def test_rows_of_every_source_are_merged_in_time_order_each_naming_its_source() -> None:
    answer = await build(Scripted(), SOURCES, start=None, end=None, limit=100, offset=0)
    order = [(r["source"], r["t"]) for r in answer["rows"]]
    assert order == [("pcap:core.pcap", 100.0), ("bpftrace:bt-1", 100.25), ("serial:/dev/ttyUSB0", 100.5),
                     ("pcap:core.pcap", 101.0), ("bpftrace:bt-1", 101.25), ("serial:/dev/ttyUSB0", 101.5),
                     ("pcap:core.pcap", 102.0), ("serial:/dev/ttyUSB0", 102.5)]
    assert answer["rows"][0]["fields"] == {"_ws.col.Info": "f1"} and answer["rows"][0]["frame"] == 1
    assert answer["rows"][1]["output"] == "b0" and answer["rows"][2]["dir"] == "rx"
    assert [s["rows"] for s in answer["sources"]] == [3, 3, 2] and answer["next_offset"] is None
    assert answer["span"] == {"first": "1970-01-01T00:01:40.000000Z", "last": "1970-01-01T00:01:42.500000Z"}


async def test_an_offset_shifts_one_source_before_the_merge() -> None:
    sources = [SOURCES[0], {**SOURCES[1], "offset_ms": -1000}]
    answer = await build(Scripted(), sources, start=None, end=None, limit=100, offset=0)
    serial = [r["t"] for r in answer["rows"] if r["source"].startswith("serial")]
    assert serial == [99.5, 100.5, 101.5] and answer["sources"][1]["offset_ms"] == -1000


async def test_the_window_goes_into_the_capture_filter_in_the_capture_s_own_clock() -> None:
    caller = Scripted()
    sources = [{**SOURCES[0], "filter": "ngap", "offset_ms": 500}, SOURCES[1]]
    answer = await build(caller, sources, start=101, end="1970-01-01T00:01:42Z", limit=100, offset=0)
    flt = next(a for n, a in caller.calls if n == "pcap_timeline")["display_filter"]
    assert flt == "(ngap) && frame.time_epoch >= 100.4999995 && frame.time_epoch <= 101.5000005"
    assert [r["t"] for r in answer["rows"] if r["source"].startswith("serial")] == [101.5]


async def test_a_cut_source_stops_the_merge_at_its_last_row_and_says_where_to_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline_source, "SOURCE_CAP", 2)
    answer = await build(Scripted(frames=5, serial=1), SOURCES[:2], start=None, end=None, limit=100,
                                  offset=0)
    assert answer["complete_until"] == 101.0 and "start=101.0" in answer["hint"]
    assert [r["t"] for r in answer["rows"]] == [100.0, 100.5]
    assert answer["sources"][0]["cut"] and answer["sources"][0]["cut_at"] == 101.0
    assert not answer["sources"][1]["cut"]


async def test_paging_the_merged_rows() -> None:
    first = await build(Scripted(), SOURCES, start=None, end=None, limit=3, offset=0)
    second = await build(Scripted(), SOURCES, start=None, end=None, limit=10, offset=first["next_offset"])
    whole = await build(Scripted(), SOURCES, start=None, end=None, limit=100, offset=0)
    assert first["rows"] + second["rows"] == whole["rows"] and second["next_offset"] is None


async def test_kernel_log_lines_get_crash_s_boot_date_plus_their_seconds_since_boot() -> None:
    log = ["[    0.000000] Linux version 6.1", "[    2.396920]  </TASK>", "  continued", "[    2.500000] end"]
    ctime = ["[Wed Nov 25 18:54:58 UTC 2026] Linux version 6.1", "[Wed Nov 25 18:55:00 UTC 2026]  </TASK>",
             "  continued", "[Wed Nov 25 18:55:00 UTC 2026] end"]
    answer = await build(Scripted(log=log, ctime=ctime), [{"crash": "s1"}], start=None, end=None,
                                  limit=100, offset=0)
    rows = answer["rows"]
    assert [r["text"] for r in rows] == ["Linux version 6.1", " </TASK>", "  continued", "end"]
    assert rows[0]["time"] == "2026-11-25T18:54:58.000000Z" and rows[1]["time"] == "2026-11-25T18:55:00.396920Z"
    assert rows[2]["t"] == rows[1]["t"] and rows[1]["uptime"] == 2.39692
    assert "18:54:58" in answer["sources"][0]["note"]


async def test_a_kernel_log_whose_clock_steps_back_keeps_its_record_order_and_counts_the_steps() -> None:
    # As on a real boot: the tsc-early clocksource line is stamped before the line logged ahead of it.
    log = ["[    0.000000] Linux version 6.1", "[    0.048000] smpboot", "[    0.002321] clocksource: tsc-early",
           "[    0.050000] after"]
    ctime = [f"[Wed Nov 25 18:54:58 UTC 2026] {line[15:]}" for line in log]
    answer = await build(Scripted(log=log, ctime=ctime, frames=1, serial=0, bpf=0),
                         [{"crash": "s1"}, {"pcap": "a.pcap"}], start=None, end=None, limit=100, offset=0)
    kernel = [r["text"] for r in answer["rows"] if r["source"] == "crash:s1"]
    assert kernel == [line[15:] for line in log]
    assert answer["sources"][0]["steps_back"] == 1 and "steps_back" not in answer["sources"][1]
    assert answer["span"] == {"first": "1970-01-01T00:01:40.000000Z", "last": "2026-11-25T18:54:58.050000Z"}


async def test_kernel_log_without_a_pairing_log_minus_t_says_so() -> None:
    answer = await build(Scripted(log=["[    1.000000] a"], ctime=["[Wed Nov 25 18:55:00 UTC 2026] b"]),
                                  [{"crash": "s1"}], start=None, end=None, limit=10, offset=0)
    assert answer["rows"] == [] and "not derivable" in answer["sources"][0]["note"] and "hint" in answer


async def test_a_run_without_line_times_is_not_placed_and_says_why() -> None:
    answer = await build(Scripted(times=False), [{"bpftrace": "bt-1"}], start=None, end=None, limit=10,
                                  offset=0)
    assert answer["rows"] == [] and "without their times" in answer["sources"][0]["note"]


@pytest.mark.parametrize(("sources", "wanted"), [
    ([], "1 to 8 sources"),
    ([{"pcapp": "x"}], "exactly one of"),
    ([{"pcap": "x", "serial": "y"}], "exactly one of"),
    ([{"serial": "/dev/x", "filter": "ngap"}], "not an option of a serial source"),
    ([{"pcap": "x", "offest_ms": 3}], "not an option"),
    ([{"pcap": "x", "offset_ms": "soon"}], "milliseconds"),
    ([{"pcap": "x", "offset_ms": 1e20}], "milliseconds"),  # was an uncoded OverflowError while writing the time
    ([{"pcap": "x"}, {"pcap": "/y/x"}], "same label"),
    (["x"], "is an object"),
])
async def test_wrong_sources_get_coded_errors(sources: list[Any], wanted: str) -> None:
    with pytest.raises(DiagdError) as caught:
        await build(Scripted(), sources, start=None, end=None, limit=10, offset=0)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT and wanted in caught.value.message


async def test_close_matches_are_named() -> None:
    with pytest.raises(DiagdError) as caught:
        timeline.parse_sources(ADAPTERS, [{"pcap": "x", "offest_ms": 3}])
    assert caught.value.details["did_you_mean"] == ["offset_ms"]
    with pytest.raises(DiagdError) as caught:
        timeline.parse_sources(ADAPTERS, [{"serail": "x"}])
    assert caught.value.details["did_you_mean"] == ["serial"]


@pytest.mark.parametrize("value", ["tomorrow", [1], True, float("nan"), 1e300])
async def test_a_time_that_is_neither_seconds_nor_iso_is_refused(value: Any) -> None:
    with pytest.raises(DiagdError) as caught:
        await build(Scripted(), SOURCES, start=value, end=None, limit=10, offset=0)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT and caught.value.details["path"] == "$.start"


async def test_a_failing_source_is_named_in_the_error() -> None:
    with pytest.raises(DiagdError) as caught:
        await build(Scripted(), [{"serial": "/dev/none"}], start=None, end=None, limit=10, offset=0)
    assert caught.value.code == ErrorCode.NOT_FOUND and caught.value.message.startswith("source serial:/dev/none:")


async def test_a_row_time_outside_what_iso_8601_can_write_is_a_coded_error_naming_the_source() -> None:
    caller = Scripted()
    caller.frames[0]["frame.time_epoch"] = "1e15"  # a pcapng block's 64-bit timestamp can say this
    with pytest.raises(DiagdError) as caught:
        await build(caller, SOURCES[:1], start=None, end=None, limit=10, offset=0)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT and caught.value.message.startswith("source pcap:")


@pytest.mark.parametrize("text", ['ngap', '(sip || ngap) && frame.len > 60', 'sip.from contains ")"',
                                  'frame contains "\\")(\\"" && (udp)', ''])
def test_a_capture_filter_that_stands_alone_is_taken(text: str) -> None:
    assert timeline.parse_sources(ADAPTERS, [{"pcap": "/x.pcap", "filter": text}])[0].options["filter"] == text


@pytest.mark.parametrize("text", ["a) || (1", "ngap) || (frame", "(ngap", 'sip.from contains ")', ")("])
def test_a_capture_filter_that_would_escape_the_time_window_is_refused(text: str) -> None:
    """`(filter) && window`: a filter closing the parenthesis itself would take frames out of the window."""
    with pytest.raises(DiagdError) as refused:
        timeline.parse_sources(ADAPTERS, [{"pcap": "/x.pcap", "filter": text}])
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT and "unbalanced" in refused.value.message
