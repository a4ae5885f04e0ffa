"""`mask_subscriber_ids = true` hides subscriber digits in the output of EVERY pcap tool.

For each shared capture (and one built here with many IMS subscribers), the identities are found
independently of the daemon with `tshark -T fields`; then every tool the daemon lists as pcap_* or
ngap_* is called on that capture, with masking on and off, and the whole JSON answer (results and
errors, plus the TSV file a packet list writes) is searched for each identity's digits. Masking on:
none may appear. Masking off: each appears somewhere, which proves the calls reach the digits.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_pcap import client_for, make_env
from tests.pcaps import PCAPS, pcap
from tests.support import pcap_oracle as oracle

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None or shutil.which("tshark") is None,
                       reason="sharkd/tshark (wireshark-common, tshark) are not installed"),
]

# The test's own idea of where subscriber identities live (deliberately not imported from the daemon).
VALUE_FIELDS = ("e212.imsi", "nas_5gs.mm.suci.msin", "e164.msisdn")
DIGIT_FIELDS = ("diameter.Subscription-Id-Data", "diameter.User-Name")
SIP_USER_FIELDS = ("sip.from.user", "sip.to.user", "sip.r-uri.user", "sip.contact.user", "sip.pai.user")
TEXT_FIELDS = ("http.request.uri", "http2.headers.path", "json.value.string", "diameter.Session-Id", "sip.pai.addr")
FIELDS = VALUE_FIELDS + DIGIT_FIELDS + SIP_USER_FIELDS + TEXT_FIELDS
SBI_7777 = "tcp.port==7777,http2"
MB2 = 2 * 1024 * 1024


@dataclass
class Case:
    path: str
    decode_as: str | None
    first_frame: dict[str, int] = field(default_factory=dict)  # identity digits -> first frame carrying it
    short_users: dict[str, int] = field(default_factory=dict)  # SIP extensions (101): checked as `sip:101@`

    @property
    def frames(self) -> list[int]:
        return sorted({*self.first_frame.values(), *self.short_users.values()})[:100]


def find_identities(path: str, decode_as: str | None) -> Case:
    argv = ["tshark", "-r", path, "-n", "-o", "nas-5gs.null_decipher:TRUE", "-T", "fields", "-E", "occurrence=a",
            "-E", "aggregator=,", "-e", "frame.number", *[a for f in FIELDS for a in ("-e", f)]]
    if decode_as:
        argv[3:3] = ["-d", decode_as]
    def run() -> str:  # tshark's fields, kept on disk: the identities to look for, not diagd's answer
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout
    out = oracle.cached_text(Path(path), [*argv, oracle.config_key()], run)
    case = Case(path, decode_as)
    for line in out.splitlines():
        number, *cells = line.split("\t")
        for name, cell in zip(FIELDS, cells, strict=True):
            found: list[str] = []
            for value in filter(None, cell.split(",") if name not in TEXT_FIELDS else [cell]):
                if name in VALUE_FIELDS or (name in DIGIT_FIELDS and value.isdigit()):
                    found.append(value)
                elif name in SIP_USER_FIELDS:
                    runs = re.findall(r"\d+", value)
                    found += [r for r in runs if len(r) >= 7]
                    if value.isdigit() and len(value) < 7:
                        case.short_users.setdefault(value, int(number))
                elif name in TEXT_FIELDS:
                    found += re.findall(r"(?i)(?:imsi-?|msisdn-|tel:\+?)(\d{7,})", value)
            for digits in found:
                case.first_frame.setdefault(digits, int(number))
    return case


def build_ims_capture(path: Path, subscribers: int = 40) -> None:
    """SIP REGISTERs of many IMS subscribers (IMSI user parts, tel: MSISDNs), as a plain pcap.
    IMSIs descend frame by frame, so sorting by them reverses the frame order."""
    packets = []
    for n in range(subscribers):
        imsi = f"00101{subscribers - n:010d}"
        msisdn = f"49151{n:07d}"
        domain = "ims.mnc001.mcc001.3gppnetwork.org"
        sip = (f"REGISTER sip:{domain} SIP/2.0\r\n"
               f"Via: SIP/2.0/UDP 10.0.0.{n + 1}:5060;branch=z9hG4bK{n:04d}\r\n"
               f"From: <sip:{imsi}@{domain}>;tag={n}\r\nTo: <sip:{imsi}@{domain}>\r\n"
               f"Call-ID: reg{n}@10.0.0.{n + 1}\r\nCSeq: 1 REGISTER\r\n"
               f"Contact: <sip:{imsi}@10.0.0.{n + 1}:5060>\r\n"
               f"P-Asserted-Identity: <tel:+{msisdn}>\r\n"
               f'Authorization: Digest username="{imsi}@{domain}", realm="{domain}", uri="sip:{domain}", '
               f'nonce="", response=""\r\nContent-Length: 0\r\n\r\n').encode()
        udp = struct.pack("!HHHH", 5060, 5060, 8 + len(sip), 0) + sip
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), n, 0, 64, 17, 0,
                         bytes([10, 0, 0, n + 1]), bytes([10, 0, 1, 1]))
        checksum = sum(struct.unpack("!10H", ip))
        checksum = (checksum & 0xFFFF) + (checksum >> 16)
        ip = ip[:10] + struct.pack("!H", ~checksum & 0xFFFF) + ip[12:]
        frame = b"\x02\x00\x00\x00\x00\x02" + b"\x02\x00\x00\x00\x00\x01" + b"\x08\x00" + ip + udp
        packets.append(struct.pack("<IIII", 1_600_000_000 + n, 0, len(frame), len(frame)) + frame)
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1) + b"".join(packets))


def calls(case: Case) -> dict[str, list[dict[str, Any]]]:
    """Arguments for every pcap tool, aimed at the frames that carry identities.

    The extract filter and one text search quote an identity, and one timeline filter is broken on
    purpose: what the caller typed comes back (source, include_command, error details) masked too.
    """
    cap: dict[str, Any] = {"pcap_path": case.path, "include_command": True}
    if case.decode_as:
        cap["decode_as"] = case.decode_as
    frames = case.frames or [1]
    some = next(iter(case.first_frame), "0000000")
    flt = f"frame.number in {{{', '.join(map(str, frames))}}}"
    return {
        "pcap_info": [cap],
        # Built and waited for: the unfiltered page below then comes from the index (served_by: index).
        "pcap_index": [{**cap, "wait_s": 120}],
        "pcap_frames_by_filter": [{**cap, "display_filter": flt, "limit": 5000},
                                  {**cap, "display_filter": "", "limit": 5000}],
        "pcap_timeline": [{**cap, "display_filter": flt, "fields": list(FIELDS), "limit": 5000},
                          {**cap, "display_filter": f'{flt} && e212.imsi == "{some}" &&', "fields": ["e212.imsi"]}],
        "pcap_frame_detail": [{**cap, "frame_numbers": frames, "verbosity": "full", "max_bytes": MB2}],
        "pcap_text_search": [{**cap, "display_filter": flt, "query": r"\d{3,}", "is_regex": True, "limit": 5000,
                              "max_matches": 1000, "max_bytes": MB2},
                             {**cap, "display_filter": flt, "query": some}],
        "pcap_follow": [{**cap, "frame_number": f} for f in frames[:3]],
        "pcap_packet_list": [{**cap, "display_filter": flt, "extra_columns": [{"field": f} for f in FIELDS],
                              "preview_rows": 500}],
        "pcap_extract_subcapture": [{**cap,
                                     "display_filter": f'frame.number == {frames[0]} || frame contains "{some}"'}],
        "ngap_ue_sessions": [cap, {**cap, "view": "procedures"}],
        "pcap_sequence_diagram": [{**cap, "display_filter": flt, "max_arrows": 1000}],
        "pcap_stats": [{**cap, "kind": kind} for kind in ("expert", "conversations", "endpoints")]
                      + [{**cap, "kind": "io", "display_filter": flt, "interval_ms": 1000}],
        "ngap_pdu_session_summary": [cap],
        "pcap_list_fields": [{"query": "imsi", "limit": 20}],
        "pcap_fields_search": [{"prefix": "e212.", "keyword": "imsi"}],
        "pcap_config_get": [{}],
    }


def start(root: Path, masked: bool) -> DaemonProcess:
    root.mkdir(parents=True, exist_ok=True)
    return start_daemon(make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{root.parent}"]\n'
                                       "call_timeout_s = 120\n"
                                       f"[pcap]\nmax_loaded = 6\nmask_subscriber_ids = {str(masked).lower()}\n"))


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, DaemonProcess, Path]]:
    root = tmp_path_factory.mktemp("maskd")
    built = root / "ims_many_subscribers.pcap"
    build_ims_capture(built)
    masked, plain = start(root / "on", True), start(root / "off", False)
    yield masked, plain, built
    for d in (masked, plain):
        d.stop()
        shutil.rmtree(d.env.runtime, ignore_errors=True)


async def run_every_tool(daemon: DaemonProcess, case: Case) -> dict[str, str]:
    """`tool#i` -> the full JSON answer (error or result; a written TSV is appended)."""
    answers: dict[str, str] = {}
    async with client_for(daemon) as client:
        listed = {t.name for t in (await client.list_tools()).tools if t.name.startswith(("pcap_", "ngap_"))}
        todo = calls(case)
        assert listed <= set(todo), f"pcap tools not covered by the masking test: {sorted(listed - set(todo))}"
        # Loaded first: an answer given while sharkd loads is marked provisional and may leave parts
        # out, and the masked and plain daemons would differ by timing, not by masking.
        with trio.fail_after(300):
            while True:
                info = json.loads((await client.call_tool("pcap_info", todo["pcap_info"][0])).content[0].text)
                if info.get("served_by") == "sharkd" and "sbi_ports" in info:
                    break
                await trio.sleep(0.2)
        for name, arg_list in todo.items():
            for i, args in enumerate(arg_list):
                with trio.fail_after(300):
                    result = await client.call_tool(name, args)
                text = result.content[0].text
                payload = json.loads(text)
                if name == "pcap_packet_list" and not result.is_error:
                    text += "\n" + Path(payload["output_path"]).read_text()
                answers[f"{name}#{i}"] = text
    return answers


def leaks(answers: dict[str, str], case: Case) -> list[str]:
    found = []
    for digits in case.first_frame:
        pattern = re.compile(rf"(?<!\d){digits}(?!\d)")
        for where, text in answers.items():
            if m := pattern.search(text):
                found.append(f"{digits} in {where}: ...{text[max(0, m.start() - 60):m.end() + 20]}...")
    for user in case.short_users:
        for where, text in answers.items():
            if f"sip:{user}@" in text:
                found.append(f"sip:{user}@ in {where}")
    return found


def cases() -> list[tuple[str, str | None]]:
    names = sorted(p.name for p in PCAPS.glob("*.pcap*")) if PCAPS.is_dir() else []
    return [(name, SBI_7777 if name.startswith("adrian_") and "sbi" in name else None) for name in names]


async def check(daemons: tuple[DaemonProcess, DaemonProcess, Path], case: Case) -> None:
    if not case.first_frame and not case.short_users:
        pytest.skip(f"{Path(case.path).name} carries no subscriber identity")
    masked, plain, _ = daemons
    answers: dict[bool, dict[str, str]] = {}

    async def run_on(daemon: DaemonProcess, is_masked: bool) -> None:
        answers[is_masked] = await run_every_tool(daemon, case)

    async with trio.open_nursery() as nursery:  # two daemons of their own: side by side (most of it is waiting)
        nursery.start_soon(run_on, masked, True)
        nursery.start_soon(run_on, plain, False)
    hidden, shown = answers[True], answers[False]
    seen = "\n".join(shown.values())
    missing = [d for d in case.first_frame if not re.search(rf"(?<!\d){d}(?!\d)", seen)]
    missing += [u for u in case.short_users if f"sip:{u}@" not in seen]
    assert not missing, f"unmasked answers never show {missing}: the calls do not reach the identities"
    assert not leaks(hidden, case)
    # Masking hides digits, not answers: the same calls succeed with the same shape either way (a
    # written sub-capture adds a warning that its packets are not masked).
    def shape(answers: dict[str, str]) -> dict[str, set[str]]:
        return {k: set(json.loads(v.split("\n", 1)[0])) - {"warnings"} for k, v in answers.items()}

    assert shape(hidden) == shape(shown)


@pytest.mark.parametrize(("name", "decode_as"), cases())
async def test_every_pcap_tool_masks_every_identity_of_a_shared_capture(
        daemons: tuple[DaemonProcess, DaemonProcess, Path], name: str, decode_as: str | None) -> None:
    await check(daemons, find_identities(pcap(name), decode_as))


async def test_many_ims_subscribers_and_sorting_on_real_values(
        daemons: tuple[DaemonProcess, DaemonProcess, Path]) -> None:
    case = find_identities(str(daemons[2]), None)
    assert len([d for d in case.first_frame if len(d) == 15]) == 40  # IMSI user parts
    assert len([d for d in case.first_frame if d.startswith("49151")]) == 40  # tel: MSISDNs
    await check(daemons, case)
    # Sorting runs on the real values: the last frame's IMSI is the smallest, masked or not (sorting
    # masked values, all equal, would keep the frame order).
    args = {"pcap_path": case.path, "fields": ["sip.from.user", "frame.number"], "display_filter": "sip",
            "sort_by": "sip.from.user", "limit": 3}
    orders = []
    for daemon in daemons[:2]:
        async with client_for(daemon) as client:
            with trio.fail_after(300):
                result = await client.call_tool("pcap_timeline", args)
        orders.append([row["frame.number"] for row in json.loads(result.content[0].text)["rows"]])
    assert orders[0] == orders[1] == [40, 39, 38]
