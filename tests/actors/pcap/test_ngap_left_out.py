"""What the NGAP summaries leave out because tshark did not decode it, and say so (actors/pcap/answers/left_out.py).

SBI on a TCP port Wireshark does not know is HTTP/2 that tshark shows as bare TCP payload: every NGAP summary
names those conversations (by server port) and the decode-as rule that includes them. diagd finds them with
its probe (decode_check.py: one tshark pass without a rule, the first bytes of each conversation); the second
answer here never imports diagd: `tshark -T fields` lists the conversations whose payload holds the HTTP/2
connection preface (RFC 9113 3.4: its receiver is the server) and those that the captures' MANIFEST.md rules
decode as HTTP/2 (h2c without a preface), minus every conversation tshark decodes as HTTP/2 on its own. diagd
must find exactly those, plus any conversation captured after its preface (a capture started mid-connection:
Magma's gRPC on loopback) that tshark, told to read its server port as HTTP/2, decodes without a malformed
frame; and with the MANIFEST's rules applied nothing is left out.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from diagd.actors.pcap.answers import left_out
from diagd.actors.pcap.shark import decode_check
from tests.pcaps import PCAPS, corpus
from tests.support import built_roaming, pcap_oracle
from tests.support.built_captures import MERGES, merged
from tests.support.capture_identity import content_id

PREFACE = "50:52:49:20:2a:20:48:54:54:50:2f:32:2e:30:0d:0a:0d:0a:53:4d:0d:0a:0d:0a"  # PRI * HTTP/2.0 ... SM ...
CAPTURES = corpus() + ([merged("sandbox-n2-n4-sbi"), built_roaming.built()] if corpus() else [])


def rows(path: Path, *args: str) -> list[list[str]]:
    """`tshark -T fields` rows (first occurrences), kept on disk by the capture's bytes and the argv."""
    argv = ["tshark", "-r", str(path), "-n", *args, "-T", "fields", "-E", "occurrence=f"]

    def run() -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in pcap_oracle.cached_text(path, [*argv, pcap_oracle.config_key()], run)
            .splitlines() if line]


def manifest_rules(path: Path) -> list[str]:
    """MANIFEST.md's decode-as rules for the capture (a merged one: those of its SBI part)."""
    for name, (_, rule, _) in MERGES.items():
        if path in (merged(name), *([built_roaming.built()] if name == built_roaming.BASE else [])):
            return [rule] if rule else []
    return pcap_oracle.decode_as(path)


def undecoded(path: Path, rules: list[str]) -> set[tuple[int, int]]:
    """(tcp.stream, server port) of the conversations carrying HTTP/2 that tshark with `rules` leaves undecoded."""
    dec = [a for rule in rules for a in ("-d", rule)]
    decoded = {int(r[0]) for r in rows(path, *dec, "-Y", "http2", "-e", "tcp.stream")}
    found = {(int(r[0]), int(r[1])) for r in rows(path, "-Y", f"tcp.payload contains {PREFACE}", "-e", "tcp.stream",
                                                 "-e", "tcp.dstport")}
    for rule in manifest_rules(path):
        port = int(rule.split("==")[1].split(",")[0])
        found |= {(int(r[0]), port) for r in rows(path, "-d", rule, "-Y", f"http2 && tcp.port == {port}",
                                                  "-e", "tcp.stream")}
    return {(stream, port) for stream, port in found if stream not in decoded}


def confirmed(path: Path, pairs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Those (tcp.stream, server port) that tshark decodes as HTTP/2, without a malformed frame, when told that the
    port carries HTTP/2."""
    out: set[tuple[int, int]] = set()
    for port in sorted({port for _, port in pairs}):
        streams = ", ".join(str(s) for s, p in sorted(pairs) if p == port)
        h2 = {int(r[0]) for r in rows(path, "-d", f"tcp.port=={port},http2", "-Y",
                                      f"tcp.stream in {{{streams}}} && http2", "-e", "tcp.stream")}
        bad = {int(r[0]) for r in rows(path, "-d", f"tcp.port=={port},http2", "-Y",
                                       f"tcp.stream in {{{streams}}} && _ws.malformed", "-e", "tcp.stream")}
        out |= {(s, port) for s in h2 - bad}
    return out


def probe(path: Path) -> decode_check.Probe:
    return trio.run(decode_check.Probes().probe, path, content_id(path), ())


def diagd_undecoded(found: decode_check.Probe, rules: list[str]) -> set[tuple[int, int]]:
    return {(c.stream, port) for port, convs in left_out.undecoded_http2(found, rules).items() for c in convs}


@pytest.mark.parametrize("path", CAPTURES or [PCAPS / "(no corpus)"], ids=lambda p: p.name)
def test_undecoded_sbi_agrees_with_tshark_fields(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    found = probe(path)
    want = undecoded(path, [])
    got = diagd_undecoded(found, [])
    assert got >= want
    assert confirmed(path, got - want) == got - want
    want = got
    rules = manifest_rules(path)
    if rules:  # MANIFEST.md's rules include everything: nothing is left out with them
        assert diagd_undecoded(found, rules) == undecoded(path, rules) == set()
        assert left_out.sbi_warning(found, rules) is None
    warning = left_out.sbi_warning(found, [])
    if not want:
        assert warning is None
        return
    ports = sorted({port for _, port in want})
    where = ", ".join(f"tcp/{p} ({sum(1 for _, q in want if q == p)})" for p in ports)
    assert warning is not None and warning.startswith(
        f"SBI left out: {len(want)} TCP conversations carry HTTP/2 that tshark did not decode (a port it does not "
        f"know), by port: {where}; ")
    how = warning.partition(" To include them: ")[2]
    assert all(f"tcp/{p}: decode_as" in how for p in ports), how
    if rules:  # how to include them: the MANIFEST's rule, where every conversation on the port is HTTP/2
        assert how == "; ".join(f"tcp/{p}: decode_as=tcp.port=={p},http2" for p in ports)
        assert {f"tcp.port=={p},http2" for p in ports} == set(rules)


def test_the_corpus_has_sbi_left_out_with_and_without_a_preface() -> None:
    """The comparison above is only as strong as the corpus: HTTP/2 left undecoded with its connection preface
    (Open5GS on 7777) and without one (h2c prior knowledge, found by MANIFEST's rule only), and HTTP/2 tshark
    decodes on its own (OAI on 8080), which is not left out."""
    if not corpus():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    with_preface = undecoded(PCAPS / "adrian_sandbox_sbi.pcap", [])
    assert len(with_preface) >= 9 and {port for _, port in with_preface} == {7777}
    extra = PCAPS.with_name("pcaps-extra")
    assert undecoded(extra / "ngtester_open5gs_T04_ng_reset_amf_ngap_nas_sbi.pcap", [])
    assert undecoded(extra / "ngtester_chain_free5gc_pathswitch_then_release_amf_ngap_nas_sbi.pcap", [])
    decoded = rows(extra / "oaifed_steering_control_plane.pcap", "-Y", "http2", "-e", "tcp.stream")
    assert decoded and not undecoded(extra / "oaifed_steering_control_plane.pcap", [])


@pytest.mark.parametrize(("rule", "ports"), [
    ("tcp.port==7777,http2", {7777}), (" tcp.port == 8000 , http2 ", {8000}),
    ("tcp.port==8000-8002,http2", {8000, 8001, 8002}),
    ("tcp.port==9000:2,http2", {9000, 9001}), ("tcp.port==7777,http", set()), ("udp.port==7777,http2", set()),
    ("tcp.port==x,http2", set())])
def test_the_ports_applied_rules_hand_to_http2(rule: str, ports: set[int]) -> None:
    assert left_out.http2_ports([rule]) == ports


async def test_a_probe_is_kept_on_disk_for_the_next_daemon_and_a_damaged_one_probed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted daemon's first NGAP answer from an index would wait for the probe's pass over the whole
    file (40 s a GB): the probe of a file version is kept on disk and read back instead."""
    path = PCAPS / "adrian_sandbox_sbi.pcap"
    if not path.exists():
        pytest.skip(f"{path.name} is not in the corpus")
    first = decode_check.Probes(tmp_path)
    probing = first.begin(path, "1:2:3:4", [])
    await probing.done.wait()
    want = probing.result()
    assert len(list(tmp_path.glob("*.pickle"))) == 1

    async def no_pass(*_: object) -> decode_check.Probe:
        raise AssertionError("probed again")
    monkeypatch.setattr(decode_check, "_probe", no_pass)
    again = decode_check.Probes(tmp_path).begin(path, "1:2:3:4", [])
    await again.done.wait()
    assert again.result().conversations.keys() == want.conversations.keys()
    for kept in tmp_path.glob("*.pickle"):
        kept.write_bytes(b"\x80\x09")  # damaged
    monkeypatch.undo()
    damaged = decode_check.Probes(tmp_path).begin(path, "1:2:3:4", [])
    await damaged.done.wait()
    assert damaged.result().conversations.keys() == want.conversations.keys()
