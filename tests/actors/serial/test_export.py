"""export_serial_pcapng's file: every Tx/Rx record of a raw log is one packet, read back by the real
tshark and capinfos (never by our own parser) with identical bytes, direction and timestamp."""

from __future__ import annotations

import json
import os
import subprocess
import tracemalloc
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from diagd.actors._paths import caller_stem
from diagd.actors.serial.export import EXTENSION, export_path, export_session, find_session
from diagd.protocol.errors import DiagdError, ErrorCode

PORT = "/dev/ttyUSB7"
FIELDS = ["frame.number", "frame.time_epoch", "frame.len", "frame.packet_flags_direction", "frame.p2p_dir",
          "exported_pdu.exported_pdu", "frame.protocols"]


def tshark_packets(path: Path) -> list[dict[str, str]]:
    """One dict per packet as `tshark -T fields` prints it (no decode-as, no profile)."""
    argv = ["tshark", "-r", str(path), "-T", "fields", "-E", "occurrence=f"]
    for field in FIELDS:
        argv += ["-e", field]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [dict(zip(FIELDS, line.split("\t"), strict=True)) for line in out.splitlines()]


def capinfos(path: Path) -> dict[str, str]:
    out = subprocess.run(["capinfos", "-M", str(path)], capture_output=True, text=True, check=True).stdout
    pairs = (line.split(":", 1) for line in out.splitlines() if ":" in line and not line.startswith(" "))
    return {key.strip(): value.strip() for key, value in pairs}


def write_log(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for record in records:
            f.write(json.dumps(record, separators=(",", ":")) + "\n")


def session_header(ts: float) -> dict[str, Any]:
    return {"ts": ts, "dir": "event", "event": "session", "port": PORT, "device": "/dev/pts/9",
            "settings": {"baudrate": 115200, "bytesize": 8, "parity": "N", "stopbits": 1}}


def check_packets(out: Path, log: Path) -> list[dict[str, str]]:
    """The export against the raw log, read independently (JSON lines, decimal timestamps)."""
    records = [json.loads(line, parse_float=Decimal) for line in log.read_text().splitlines()]
    data = [r for r in records if r["dir"] in ("tx", "rx")]
    packets = tshark_packets(out)
    assert len(packets) == len(data)
    for n, (packet, record) in enumerate(zip(packets, data, strict=True), start=1):
        assert int(packet["frame.number"]) == n
        assert Decimal(packet["frame.time_epoch"]) == record["ts"]
        assert packet["exported_pdu.exported_pdu"] == record["hex"].lower()
        # pcapng epb_flags: 01 inbound (Rx), 10 outbound (Tx); Wireshark's p2p_dir 1 received, 0 sent.
        assert packet["frame.packet_flags_direction"] == ("0x00000001" if record["dir"] == "rx" else "0x00000002")
        assert packet["frame.p2p_dir"] == ("1" if record["dir"] == "rx" else "0")
        assert packet["frame.protocols"] == "exported_pdu:data-text-lines"
    return packets


def test_every_tx_and_rx_record_is_one_packet_with_its_bytes_direction_and_time(tmp_path: Path) -> None:
    log, out = tmp_path / "s.jsonl", tmp_path / "s.pcapng"
    write_log(log, [
        session_header(1718000000.0),
        {"ts": 1718000000.100001, "dir": "tx", "hex": "41542B4353510D"},
        {"ts": 1718000000.100002, "dir": "rx", "hex": "0D0A2B4353513A2032332C39390D0A0D0A4F4B0D0A"},
        {"ts": 1718000000.2, "dir": "event", "event": "signals", "dtr": True},
        {"ts": 1718000000.3, "dir": "tx", "hex": "7E00FF7E"},
        {"ts": 1718000000.999999, "dir": "rx", "hex": "7E00FF" + bytes(range(256)).hex().upper() + "FF007E"},
        {"ts": 1718000001, "dir": "rx", "hex": "0D0A2B434D54493A2022534D222C310D0A"},
    ])
    done = export_session(log, out, end=None, port=PORT, application="diagd test")
    assert done["packets"] == 5 and (done["tx_packets"], done["rx_packets"]) == (2, 3)
    assert done["tx_bytes"] == 11 and done["events"] == 2 and not done["log_limit_reached"]
    packets = check_packets(out, log)
    assert packets[4]["frame.time_epoch"] == "1718000001.000000000"
    info = capinfos(out)
    assert info["Number of packets"] == "5" and info["File encapsulation"] == "wireshark-upper-pdu"
    assert info["Capture application"] == "diagd test"
    assert os.stat(out).st_mode & 0o777 == 0o600
    # The port and session are in the interface block; the lines are decoded as text with no decode-as.
    text = subprocess.run(["tshark", "-r", str(out), "-V", "-Y", "frame.number==2"], capture_output=True,
                          text=True, check=True).stdout
    assert "+CSQ: 23,99\\r\\n" in text
    ifaces = subprocess.run(["capinfos", "-I", str(out)], capture_output=True, text=True, check=True).stdout
    assert f"Name = {PORT}" in ifaces and "Description = diagd serial session s: device /dev/pts/9" in ifaces


def test_an_empty_session_is_a_valid_capture_with_no_packets(tmp_path: Path) -> None:
    log, out = tmp_path / "e.jsonl", tmp_path / "e.pcapng"
    write_log(log, [session_header(1718000000.5), {"ts": 1718000001.5, "dir": "event", "event": "closed"}])
    done = export_session(log, out, end=None, port=PORT, application="diagd test")
    assert done["packets"] == 0 and done["first_ts"] is None and done["events"] == 2
    assert tshark_packets(out) == [] and capinfos(out)["Number of packets"] == "0"


def test_a_live_log_is_exported_up_to_its_snapshot_and_a_half_written_record_is_left_out(tmp_path: Path) -> None:
    log, out = tmp_path / "l.jsonl", tmp_path / "l.pcapng"
    write_log(log, [session_header(1.0), {"ts": 2.0, "dir": "tx", "hex": "4154"}])
    end = log.stat().st_size
    with log.open("a") as f:
        f.write('{"ts":3.0,"dir":"rx","hex":"4F4B"}\n{"ts":4.0,"dir":"rx","he')
    assert export_session(log, out, end=end, port=PORT, application="t")["packets"] == 1
    out.unlink()
    assert export_session(log, out, end=None, port=PORT, application="t")["packets"] == 2


def test_a_huge_session_streams_in_bounded_memory(tmp_path: Path) -> None:
    log, out = tmp_path / "h.jsonl", tmp_path / "h.pcapng"
    chunk = (b"+CMTI: \"SM\",1\r\n" * 40).hex().upper()  # 600 bytes a record
    with log.open("w") as f:
        f.write(json.dumps(session_header(1.0)) + "\n")
        for i in range(60000):  # ~75 MB of log, ~40 MB of capture
            f.write(f'{{"ts":{1718000000 + i / 1000:.6f},"dir":"{"rx" if i % 3 else "tx"}","hex":"{chunk}"}}\n')
    tracemalloc.start()
    try:
        done = export_session(log, out, end=None, port=PORT, application="t")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert done["packets"] == 60000 and done["rx_bytes"] == 40000 * 600
    assert peak < 1 << 20  # a few records and one write buffer, not the session
    info = capinfos(out)
    assert info["Number of packets"] == "60000" and info["Strict time order"] == "True"


def test_a_failed_export_leaves_no_file_and_never_writes_through_a_link(tmp_path: Path) -> None:
    log, out = tmp_path / "s.jsonl", tmp_path / "s.pcapng"
    write_log(log, [session_header(1.0)])
    target = tmp_path / "victim"
    target.write_text("keep")
    out.symlink_to(target)
    with pytest.raises(FileExistsError):
        export_session(log, out, end=None, port=PORT, application="t")
    assert target.read_text() == "keep"
    with pytest.raises(FileNotFoundError):
        export_session(tmp_path / "gone.jsonl", tmp_path / "n.pcapng", end=None, port=PORT, application="t")
    assert not (tmp_path / "n.pcapng").exists()


def test_a_session_is_named_by_its_log_file_and_an_unknown_one_gets_close_matches(tmp_path: Path) -> None:
    names = ["dev_ttyUSB7-20240610T061320123Z.jsonl", "dev_ttyUSB7-20240610T071320123Z.jsonl",
             "dev_ttyUSB70-20240610T061320123Z.jsonl"]
    for name in names:
        (tmp_path / name).write_text("")
    assert find_session(tmp_path, PORT, names[0]) == tmp_path / names[0]
    assert find_session(tmp_path, PORT, f"/elsewhere/{names[1]}") == tmp_path / names[1]
    assert find_session(tmp_path, PORT, names[1].removesuffix(".jsonl")) == tmp_path / names[1]
    with pytest.raises(DiagdError) as info:
        find_session(tmp_path, PORT, "dev_ttyUSB7-20240610T061320124Z")
    assert info.value.code == ErrorCode.NOT_FOUND
    assert info.value.details["sessions"] == names[1::-1]  # newest first; another port's never
    assert info.value.details["did_you_mean"][0] == names[0]


# The names an agent steered by hostile text tried (issue 20): each is refused with a hint, never written.
HOSTILE_NAMES = ["/root/.ssh/authorized_keys", "../authorized_keys", "exports/../../x", ".bashrc", ".ssh",
                 "a\nb", "line\r", "keys.sh", "modem.pcapng", "-rf", "a b", "é", "x" * 65, "", ".", ".."]


def test_a_caller_names_only_a_stem_diagd_adds_the_directory_and_extension(tmp_path: Path) -> None:
    out_dir = tmp_path / "exports"
    for stem in ("modem-run1", "v1.2", "authorized_keys", "A_b-9"):
        assert caller_stem(stem, argument="name", extension=EXTENSION) == stem
        path = export_path(out_dir, PORT, keep=50, stem=stem)
        assert path == out_dir / f"{stem}.pcapng"  # always inside the exports dir, always .pcapng
    for raw in HOSTILE_NAMES:
        with pytest.raises(DiagdError) as info:
            caller_stem(raw, argument="name", extension=EXTENSION)
        assert info.value.code == ErrorCode.INVALID_ARGUMENT, raw
        assert info.value.details["argument"] == "name" and ".pcapng" in info.value.details["hint"], raw


def test_an_export_never_overwrites_a_file_nor_writes_through_a_link(tmp_path: Path) -> None:
    log = tmp_path / "dev_ttyUSB7-20240610T061320123Z.jsonl"
    write_log(log, [{"ts": "1.000001", "dir": "tx", "hex": "4154"}])
    target = tmp_path / "victim"
    target.write_text("keep")
    link = tmp_path / "link.pcapng"
    link.symlink_to(target)
    for existing in (target, link):
        with pytest.raises(OSError):
            export_session(log, existing, end=None, port=PORT, application="diagd test")
    assert target.read_text() == "keep"
    made = export_path(tmp_path / "exports", PORT, keep=5)
    export_session(log, made, end=None, port=PORT, application="diagd test")
    assert made.stat().st_mode & 0o777 == 0o600


def test_default_exports_keep_the_newest_and_are_private(tmp_path: Path) -> None:
    out_dir = tmp_path / "exports"
    made = []
    for i in range(4):
        path = export_path(out_dir, PORT, keep=3)
        path.write_text("")
        os.utime(path, (i, i))
        made.append(path)
    assert sorted(out_dir.iterdir()) == sorted(made[1:])
    assert out_dir.stat().st_mode & 0o777 == 0o700 and made[-1].name.startswith("dev_ttyUSB7-")
