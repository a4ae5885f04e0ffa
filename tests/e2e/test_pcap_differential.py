"""pcap answers compared exactly with Wireshark's own command-line tools, run here in the test, on
every shared capture (and on variants built from them): capinfos for pcap_info, `tshark -T fields`
for timelines, tshark display filters for follow, and the `equivalent_command` each tool shows."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import client_for, make_env
from tests.pcaps import PCAPS
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

Call = Callable[..., Awaitable[dict[str, Any]]]
SBI_DECODE = "tcp.port==7777,http2"  # HTTP/2 SBI on 7777 is never detected by tshark 4.0 (MANIFEST.md)


def captures() -> list[Path]:
    found = sorted(p for p in PCAPS.glob("*.pcap*") if p.is_file())
    if not found:
        pytest.skip(f"no real captures in {PCAPS} (set DIAGD_TEST_PCAPS to the folder of shared/pcaps)")
    return found


def decode_as(path: Path) -> list[str]:
    return [SBI_DECODE] if "sbi" in path.name else []


@pytest.fixture(scope="module")
def wsconf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty Wireshark config dir: tshark here runs with default preferences, whoever runs the test."""
    return tmp_path_factory.mktemp("wsconf")


def tshark(wsconf: Path, path: Path, *args: str) -> str:
    """The reference tshark's output, kept on disk by the capture's bytes, the tshark version, the argv and
    the configuration (tests/support/pcap_oracle.cached_text): many modules compare with the same runs."""
    argv = ["tshark", "-r", str(path), "-n", "-2", *[a for r in decode_as(path) for a in ("-d", r)], *args]
    return oracle.cached_text(path, [*argv, oracle.config_key(tool_env(wsconf))], lambda: run(wsconf, argv))


def tool_env(wsconf: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "TZ": "UTC", "WIRESHARK_CONFIG_DIR": str(wsconf), "HOME": str(wsconf)}


def run(wsconf: Path, argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=tool_env(wsconf))
    assert done.returncode == 0, (argv, done.stderr[-2000:])
    return done.stdout


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Rarer inputs built from the real captures: nanosecond pcapng (with sub-microsecond times),
    nanosecond pcap, and a pcapng mixing microsecond and nanosecond interfaces."""
    out = tmp_path_factory.mktemp("variants")
    n2, magma = PCAPS / "adrian_sandbox_n2.pcap", PCAPS / "magma_gx_gy_combined_03.pcapng"
    if not n2.exists() or not magma.exists():
        pytest.skip(f"real captures not found in {PCAPS}")
    built = {
        "ns.pcapng": ["editcap", "-F", "pcapng", "-t", "0.000000123", str(out / "ns.pcap"), str(out / "ns.pcapng")],
        "magma_ns.pcapng": ["editcap", "-F", "pcapng", "-t", "-0.000000999", str(out / "magma_ns.pcap"),
                            str(out / "magma_ns.pcapng")],
        "mixed.pcapng": ["mergecap", "-w", str(out / "mixed.pcapng"), str(n2), str(out / "ns.pcapng")],
    }
    subprocess.run(["editcap", "-F", "nsecpcap", str(n2), str(out / "ns.pcap")], check=True, capture_output=True)
    subprocess.run(["editcap", "-F", "nsecpcap", str(magma), str(out / "magma_ns.pcap")], check=True,
                   capture_output=True)
    for argv in built.values():
        subprocess.run(argv, check=True, capture_output=True)
    return {name: out / name for name in ["ns.pcap", *built]}


@pytest.fixture(scope="module")
def diff_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("pcapdiff")
    # Every test loops over every corpus capture: each stays loaded (one load, not one per test).
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "/tmp"]\ncall_timeout_s = 120\n'
                         "[pcap]\nmax_loaded = 32\nmax_exports = 5\n")
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


@asynccontextmanager
async def session(daemon: DaemonProcess) -> AsyncIterator[Call]:
    """One MCP client for many calls (each call of test_pcap.call starts a shim)."""
    async with client_for(daemon) as client:
        async def call(tool: str, **args: Any) -> dict[str, Any]:
            with trio.fail_after(150):
                result = await client.call_tool(tool, args)
            payload: dict[str, Any] = json.loads(result.content[0].text)
            payload["_is_error"] = result.is_error
            return payload

        yield call


# ---------------------------------------------------------------------------------------------
# 1. pcap_info == capinfos


CAPTURE_PATH = "\x00capture path\x00"  # stands for the capture's path in a kept output (its File name line)


def capinfos(path: Path) -> dict[str, str]:
    argv, env = ["capinfos", "-M", str(path)], {"PATH": "/usr/bin:/bin", "TZ": "UTC"}

    def compute() -> str:  # kept on disk by the capture's bytes (tests/support/pcap_oracle.cached_text)
        done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
        return done.stdout.replace(str(path), CAPTURE_PATH)
    stdout = oracle.cached_text(path, [*argv, oracle.config_key(env)], compute).replace(CAPTURE_PATH, str(path))
    facts = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep and not line.startswith(" "):
            facts[key.strip()] = value.strip()
    return facts


async def test_info_reports_exactly_what_capinfos_reports(diff_daemon: DaemonProcess,
                                                          variants: dict[str, Path]) -> None:
    files = [*captures(), *variants.values()]
    async with session(diff_daemon) as call:
        for path in files:
            info = await call("pcap_info", pcap_path=str(path))
            assert not info["_is_error"], (path, info)
            ref = capinfos(path)
            duration = ref["Capture duration"].removesuffix(" seconds")
            where = path.name
            assert info["packet_count"] == int(ref["Number of packets"]), where
            assert info["time_start"] == ref["First packet time"].replace(" ", "T") + "Z", where
            assert info["time_end"] == ref["Last packet time"].replace(" ", "T") + "Z", where
            assert info["duration_s_text"] == duration, where
            # The number is the same decimal, not a float near it (never rounded to microseconds).
            assert Decimal(repr(info["duration_s"])) == Decimal(duration), where
            assert info["file_size_bytes"] == int(ref["File size"].removesuffix(" bytes")), where
            assert info["sha256"] == ref["SHA256"], where
            assert info["file_type"] == ref["File type"], where
            assert info["file_encapsulation"] == ref["File encapsulation"], where
    # The variants really carry what they were built for.
    built = capinfos(variants["ns.pcapng"])
    assert built["First packet time"].endswith(".142573123")
    assert built["File timestamp precision"].startswith("nanoseconds")
    assert capinfos(variants["mixed.pcapng"])["File timestamp precision"].startswith("per-packet")


async def test_info_of_a_nanosecond_capture_keeps_every_digit(diff_daemon: DaemonProcess,
                                                             variants: dict[str, Path]) -> None:
    async with session(diff_daemon) as call:
        info = await call("pcap_info", pcap_path=str(variants["ns.pcapng"]))
    assert info["time_start"] == "2026-08-19T11:37:20.142573123Z"
    assert info["time_end"] == "2026-08-19T11:37:21.235701123Z"
    assert info["duration_s"] == 1.093128 and info["duration_s_text"] == "1.093128000"


# ---------------------------------------------------------------------------------------------
# 2. pcap_timeline == tshark -T fields

GENERIC = ["frame.time_epoch", "frame.time", "frame.len", "frame.protocols", "eth.src", "ip.src", "tcp.flags",
           "ip.checksum.status", "_ws.expert.severity", "udp.payload", "_ws.col.No.", "_ws.col.Time",
           "_ws.col.Source", "_ws.col.Destination", "_ws.col.Protocol", "_ws.col.Length", "_ws.col.Info"]
# Fields that occur several times in one frame (bundled NGAP PDUs, grouped AVPs, HTTP/2 frames in
# one segment, tunnelled IP) next to ones that do not.
TELECOM = ["ngap.procedureCode", "ngap.RAN_UE_NGAP_ID", "nas_5gs.mm.message_type", "pfcp.seid", "pfcp.response_in",
           "gtpv2.cause", "gtp.teid", "diameter.Session-Id", "diameter.Result-Code", "diameter.avp.code",
           "sip.Call-ID", "sip.Via", "sip.Status-Code", "http2.streamid", "http2.headers.path", "http2.type",
           "ip.dst", "_ws.col.Info"]
PAGE = 300


def tshark_rows(wsconf: Path, path: Path, display_filter: str, fields: list[str]) -> list[list[str]]:
    text = tshark(wsconf, path, "-Y", display_filter, "-T", "fields", "-E", "occurrence=a", "-e", "frame.number",
                  *[a for f in fields for a in ("-e", f)])
    return [line.split("\t") for line in text.split("\n") if line]


def as_text(value: Any) -> str:
    """A timeline value as tshark -T fields prints it (occurrences joined by its default ',')."""
    if value is None:
        return ""
    return ",".join(value) if isinstance(value, list) else str(value)


def default_filter(fields: list[str]) -> str:
    return " || ".join(f for f in fields if not f.startswith("_ws.col."))


async def test_timelines_equal_tshark_fields_on_every_capture(diff_daemon: DaemonProcess, wsconf: Path) -> None:
    compared = 0
    multi = 0
    async with session(diff_daemon) as call:
        for path in captures():
            for fields in (GENERIC, TELECOM):
                expected = tshark_rows(wsconf, path, default_filter(fields), fields)
                pages = [(0, PAGE)] + ([(len(expected) // 2, 100)] if len(expected) > PAGE else [])
                for offset, limit in pages:
                    got = await call("pcap_timeline", pcap_path=str(path), fields=fields, limit=limit, offset=offset,
                                     decode_as=decode_as(path))
                    assert not got["_is_error"], (path.name, got)
                    assert got["total"] == len(expected), path.name
                    want = expected[offset:offset + limit]
                    assert len(got["rows"]) == len(want), path.name
                    for row, cells in zip(got["rows"], want, strict=True):
                        mine = [str(row["frame.number"]), *[as_text(row[f]) for f in fields]]
                        assert mine == cells, (path.name, row["frame.number"])
                        multi += sum(isinstance(row[f], list) for f in fields)
                        compared += 1
    assert compared > 3000 and multi > 1000  # the comparison did cover many rows and many repeated fields


async def test_timeline_columns_only_and_column_spelling(diff_daemon: DaemonProcess, wsconf: Path) -> None:
    path = PCAPS / "adrian_registration_reject.pcap"
    if not path.exists():
        pytest.skip(f"real capture {path.name} not found")
    async with session(diff_daemon) as call:
        only = await call("pcap_timeline", pcap_path=str(path), fields=["_ws.col.Info", "_ws.col.protocol"])
        assert only["total"] == 39  # columns do not narrow the default filter: every frame
        assert only["fields_resolved"]["_ws.col.protocol"] == "_ws.col.Protocol" and only["warnings"]
        expected = tshark_rows(wsconf, path, "", ["_ws.col.Info", "_ws.col.Protocol"])
        assert [[str(r["frame.number"]), r["_ws.col.Info"], r["_ws.col.Protocol"]] for r in only["rows"]] == expected
        unknown = await call("pcap_timeline", pcap_path=str(path), fields=["_ws.col.Infos"])
        assert unknown["code"] == "INVALID_FIELDS"
        assert unknown["details"]["did_you_mean"]["_ws.col.Infos"] == ["_ws.col.Info"]


# ---------------------------------------------------------------------------------------------
# 8. pcap_follow == tshark's own grouping of frames by Call-ID, Session-Id, HTTP/2 stream

KEYS_PER_CAPTURE = 20


def follow_table(wsconf: Path, path: Path) -> dict[int, dict[str, list[str]]]:
    fields = ["tcp.stream", "http2.streamid", "diameter.Session-Id", "sip.Call-ID"]
    text = tshark(wsconf, path, "-Y", "http2.streamid || diameter.Session-Id || sip.Call-ID", "-T", "fields",
                  "-E", "occurrence=a", "-E", "aggregator=\x1f", "-e", "frame.number",
                  *[a for f in fields for a in ("-e", f)])
    table = {}
    for line in text.split("\n"):
        if line:
            cells = line.split("\t")
            table[int(cells[0])] = {f: [v for v in c.split("\x1f") if v != ""] for f, c in zip(fields, cells[1:],
                                                                                          strict=True)}
    return table


def sample(items: list[int], most: int) -> list[int]:
    if len(items) <= most:
        return items
    step = len(items) / most
    return [items[int(i * step)] for i in range(most)]


async def test_follow_equals_tshark_grouping_on_every_capture_with_the_protocol(
        diff_daemon: DaemonProcess, wsconf: Path) -> None:
    followed: dict[str, set[str]] = {"sip.Call-ID": set(), "diameter.Session-Id": set(), "http2.streamid": set()}
    async with session(diff_daemon) as call:
        for path in captures():
            table = follow_table(wsconf, path)
            if not table:
                continue
            # One frame per distinct conversation key, first occurrence, sampled.
            firsts: dict[tuple[str, ...], int] = {}
            for number, values in table.items():
                key = (*values["tcp.stream"][:1], *values["http2.streamid"], *values["diameter.Session-Id"],
                       *values["sip.Call-ID"])
                firsts.setdefault(key, number)
            for number in sample(sorted(firsts.values()), KEYS_PER_CAPTURE):
                got = await call("pcap_follow", pcap_path=str(path), frame_number=number, limit=5000,
                                 decode_as=decode_as(path))
                assert not got["_is_error"], (path.name, number, got)
                kind, key = got["follow_type"], got["follow_key"]
                mine = table[number]
                if kind == "http2.streamid":
                    stream, h2 = key["tcp.stream"], key["http2.streamid"]
                    assert stream in mine["tcp.stream"] and h2 in mine["http2.streamid"]
                    expected = [n for n, v in table.items() if stream in v["tcp.stream"] and h2 in v["http2.streamid"]]
                else:
                    assert key[kind] in mine[kind], (path.name, number)
                    expected = [n for n, v in table.items() if key[kind] in v[kind]]
                assert got["total"] == len(expected), (path.name, number, key)
                assert [f["number"] for f in got["frames"]] == sorted(expected), (path.name, number, key)
                followed[kind].add(path.name)
    # Every capture that carries each protocol was followed (MANIFEST.md lists them).
    assert {"heplify_sip_ipv4_tcp.pcap", "heplify_erspan_sip_ipv4_udp.pcapng", "heplify_sip_tcp_websocket.pcap",
            "heplify_fax_call_t38_sip.pcap"} <= followed["sip.Call-ID"]
    assert {"magma_gx_gy_combined_03.pcapng", "magma_gx_gy_combined_04.pcapng",
            "magma_inbound_roaming_01.pcapng"} <= followed["diameter.Session-Id"]
    assert {"adrian_sandbox_sbi.pcap", "adrian_n4_upf_timeout_sbi.pcap",
            "adrian_sbi_nssf_reject_sbi.pcap"} <= followed["http2.streamid"]


# ---------------------------------------------------------------------------------------------
# 7. include_command: the shown command, run as shown, prints the tool's rows


def run_shown(wsconf: Path, result: dict[str, Any]) -> str:
    line = result["source"]["equivalent_command_line"]
    assert shlex.split(line) == result["source"]["equivalent_command"]
    return run(wsconf, shlex.split(line))


FRAME_START = re.compile(r"^Frame (\d+): ", re.MULTILINE)


def frame_blocks(text: str) -> dict[int, str]:
    """tshark -V output cut into frames (each one ends with a blank line)."""
    starts = list(FRAME_START.finditer(text))
    blocks = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        blocks[int(m.group(1))] = text[m.start():end].removesuffix("\n").removesuffix("\n")
    return blocks


async def test_shown_commands_print_the_same_rows(diff_daemon: DaemonProcess, wsconf: Path,
                                                  tmp_path: Path) -> None:
    reject = str(PCAPS / "adrian_registration_reject.pcap")
    magma = str(PCAPS / "magma_gx_gy_combined_04.pcapng")
    sip = str(PCAPS / "heplify_sip_ipv4_tcp.pcap")
    if not all(Path(p).exists() for p in (reject, magma, sip)):
        pytest.skip(f"real captures not found in {PCAPS}")
    async with session(diff_daemon) as call:
        # pcap_timeline: -T fields -e ...
        timeline = await call("pcap_timeline", pcap_path=magma, display_filter="diameter", limit=50, offset=10,
                              fields=["diameter.Session-Id", "diameter.avp.code", "_ws.col.Info"],
                              include_command=True)
        printed = [line.split("\t") for line in run_shown(wsconf, timeline).split("\n") if line]
        assert len(printed) == timeline["total"]
        for row, cells in zip(timeline["rows"], printed[10:60], strict=True):
            values = [[str(row["frame.number"])], row["diameter.Session-Id"], row["diameter.avp.code"],
                      row["_ws.col.Info"]]
            assert [v if isinstance(v, list) else [v] for v in values] == \
                [c.split("\x1f") if i != 3 else [c] for i, c in enumerate(cells)]

        # pcap_frames_by_filter and pcap_follow: the packet-list columns
        frames = await call("pcap_frames_by_filter", pcap_path=reject, display_filter="ngap", include_command=True)
        followed = await call("pcap_follow", pcap_path=sip, frame_number=3, include_command=True)
        for result in (frames, followed):
            printed = [line.split("\t") for line in run_shown(wsconf, result).split("\n") if line]
            assert [[str(f["number"]), f["src"], f["dst"], f["protocol"], str(f["length"]), f["info"]]
                    for f in result["frames"]] == [[c[0], c[2], c[3], c[4], c[5], c[6].strip()] for c in printed]
            assert [f["time_relative"] for f in result["frames"]] == [float(c[1]) for c in printed]

        # pcap_frame_detail: -V (and -V -x), several frames at once, data dumped in hex,
        # reassembled data sources, "previous displayed frame" among the frames asked for
        for path, numbers, verbosity in ((reject, [19, 17, 3], "summary"), (magma, [885, 57, 2], "summary"),
                                         (magma, [885, 884], "full"), (reject, [19], "full")):
            detail = await call("pcap_frame_detail", pcap_path=path, frame_numbers=numbers, verbosity=verbosity,
                                include_command=True, max_bytes=2 * 1024 * 1024)
            blocks = frame_blocks(run_shown(wsconf, detail))
            assert sorted(blocks) == sorted(numbers)
            for frame in detail["frames"]:
                assert frame["text"] == blocks[frame["frame_number"]], (path, frame["frame_number"], verbosity)

        # pcap_text_search: the matches are exactly the lines of the shown -V output holding the query
        found = await call("pcap_text_search", pcap_path=reject, query="cause", display_filter="ngap",
                           include_command=True)
        assert found["complete"] is True
        blocks = frame_blocks(run_shown(wsconf, found))
        expected = [(n, line.strip()) for n in sorted(blocks) for line in blocks[n].split("\n")
                    if "cause" in line.lower()]
        assert [(m["frame_number"], m["line"]) for m in found["matches"]] == expected and expected

        # pcap_packet_list: the TSV rows
        listed = await call("pcap_packet_list", pcap_path=reject, display_filter="nas-5gs", include_command=True,
                            extra_columns=[{"name": "cause", "field": "nas_5gs.mm.5gmm_cause"},
                                           {"name": "proc", "field": "ngap.procedureCode"}])
        tsv = Path(listed["output_path"]).read_text().split("\n")[1:-1]
        printed = [line.split("\t") for line in run_shown(wsconf, listed).split("\n") if line]
        assert [row.split("\t") for row in tsv] == [[c.strip() for c in cells] for cells in printed]
        assert any("5GS services not allowed" in row for row in tsv)

        # pcap_extract_subcapture: -w, run as shown, writes the same packets again
        extracted = await call("pcap_extract_subcapture", pcap_path=magma, display_filter="diameter.cmd.code == 272",
                               include_command=True)
        output = Path(extracted["output_path"])
        kept = tmp_path / "kept.pcapng"
        shutil.copy(output, kept)
        run_shown(wsconf, extracted)
        listing = ["-T", "fields", "-e", "frame.time_epoch", "-e", "frame.len", "-e", "frame.protocols"]
        assert run(wsconf, ["tshark", "-r", str(output), *listing]) == run(wsconf, ["tshark", "-r", str(kept),
                                                                                    *listing])
        assert len(run(wsconf, ["tshark", "-r", str(kept), *listing]).splitlines()) == extracted["packet_count"]
