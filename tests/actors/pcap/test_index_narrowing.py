"""Which layer every match of a display filter carries (index/narrowing.py: the frames cut for a tshark
pass), read off the filter's structure and its protocol names, with this Wireshark's own field catalogue:
narrowed only on a protocol's name the index translates (never on a field's protocol: dissectors put
fields in other protocols' frames), never through a negation, a frame number, Wireshark's own
numbering or a name hidden from the catalogue lookup. (What the cut then matches is compared with
`tshark -Y` over the whole file on every corpus capture in tests/e2e/test_pcap_index.py.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from diagd.actors.pcap.index import workspace
from diagd.actors.pcap.index.narrowing import cut_safe, matching, required_layers
from diagd.actors.pcap.shark.tshark import base_argv
from diagd.actors.pcap.shark.wireshark import Catalogue, read_catalogue
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.pcaps import PCAPS, PCAPS_EXTRA
from tests.support import pcap_oracle as oracle
from tests.support.index_builds import build
from tests.support.pcapedit import fragment_ipv4, packets, write_ns_pcap

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark (Wireshark) is not installed")

NARROWED = {
    'dns && dns.qry.name contains "a"': ("dns",),  # a protocol's name: its layer wherever it matches
    "dns": ("dns",),
    "(sip)": ("sip",),
    "dns || sip": ("dns", "sip"),
    "dns ^^ sip": ("dns", "sip"),
    "sip && frame.len > 100": ("sip",),  # the frame's own length: any frame has one
    'sip && sip.Method == "INVITE" and udp.port == 5060': ("sip",),
    "ip && ip.src == 10.0.0.1 && pfcp": ("pfcp",),  # the rarer of the two (no carrier layer)
    "ipv6.addr == fe80::1 && diameter": ("diameter",),
    "ip && ip.addr == 10.0.0.0/8": ("ip",),
    "(ngap && ngap.procedureCode == 15) || (nas-5gs && nas_5gs.mm.message_type == 0x41)": ("nas-5gs", "ngap"),
    "pfcp && !(pfcp.msg_type == 50)": ("pfcp",),
    "gtpv2 && gtpv2.cause in {16, 17}": ("gtpv2",),
    'sip && sip.Call-ID[0:3] == "abc"': ("sip",),
    'dns && dns.qry.name == "a && b || !c (d)"': ("dns",),  # operators inside a string are its text
    "gtpv2 && icmp": ("gtpv2",),  # either will do: the first of two alike
}
NOT_NARROWED = [
    'dns.qry.name contains "a"',  # a field's protocol is no ground: DNS's fields sit under mDNS too
    "sip.Method == \"INVITE\"",
    "ngap.procedureCode == 15",  # NGAP's fields sit in S1AP's and GTPv2's containers
    "nas_eps.emm.eea0 == 1",  # NAS's in GTPv2 and 5GS NAS
    "gtp",  # not a name the index translates (its layer and its matches differ)
    "http && dns.qry.name",
    "!dns",  # a negation holds on frames without the layer
    "not dns or sip",
    "frame.len > 100",  # every frame
    "frame",
    'frame contains "a"',
    "count(dns.a) == 0 || dns",  # a function holds without the field (0): the || narrows nothing
    "tcp.stream == 3 && tcp",  # Wireshark's own numbering: another in a cut
    "udp.stream == 1 && dns",
    "sctp.assoc_index == 0 && ngap",
    "gtpv2.session == 1 && gtpv2",
    "dns.response_in && dns",  # a frame number
    "dns && frame.number > 10",
    "dns && frame.time_relative > 1",  # since the first frame: another in a cut
    "dns && _ws.col.Info contains \"reply\"",  # columns hold frame numbers
    "http2",  # not checked to dissect in a cut as in the whole file
    "dns && ${macro}",
    "dns && (sip",  # unbalanced
    "dns &&",
    "",
    "dns && -udp.stream == -1",  # a name behind a unary minus is a name
    "dns && -frame.number == -2",
    "dns && dns.id != '\"' && udp.stream == 1",  # a character constant holding a quote hides nothing
    "dns && dns.id in {0..frame.number}",  # nor does a range's bound
    "frame.len in {dns.id, 60} && dns.id in {0..udp.stream}",
    "!" * 1200 + "dns",  # deeper than read
    "(" * 400 + "dns" + ")" * 400,
    " && ".join(["dns"] * 1200),  # a long flat chain
]


@pytest.fixture(scope="module")
def catalogue() -> Catalogue:
    return trio.run(read_catalogue)


@pytest.mark.parametrize(("display_filter", "layers"), NARROWED.items())
def test_the_layer_every_match_carries(catalogue: Catalogue, display_filter: str, layers: tuple[str, ...]) -> None:
    assert required_layers(display_filter, catalogue.kinds(display_filter)) == layers


@pytest.mark.parametrize("display_filter", NOT_NARROWED)
def test_no_layer_when_a_frame_without_it_may_match(catalogue: Catalogue, display_filter: str) -> None:
    assert required_layers(display_filter, catalogue.kinds(display_filter)) is None


# Whatever layer a cut is chosen by (response times: the protocol's), a filter applied over it must mean what
# it means in the whole file: no frame numbers, no numbering, fields of FIELD_PROTOCOLS only.
CUT_SAFE = {"frame.len > 200": True, "udp && ip.ttl < 64": True, 'sip.Method == "INVITE"': True,
            "ip.src == 10.0.0.1 || ipv6": True, "udp.stream == 1": False, "frame.number > 3": False,
            "pfcp.response_in": False, 'http.request.method == "GET"': False, "sip || http2": False,
            "frame.time_relative > 1": False, "tcp.stream in {1 2}": False,
            "sip && ssl.reassembled_in == 3": False,  # an alias of a frame-number field (tls.*)
            "sip && 6lowpan.reassembled.in == 3": False,  # a name starting with a digit
            "sip && ip.dst == 10.0.0.1 && udp.port == 5060": True, "ipv6.dst == 2001:db8::1 && sip": True}


@pytest.mark.parametrize(("display_filter", "safe"), CUT_SAFE.items())
def test_filters_that_mean_the_same_in_any_cut(catalogue: Catalogue, display_filter: str, safe: bool) -> None:
    assert cut_safe(display_filter, catalogue.kinds(display_filter)) == safe


CAPTURE = "heplify_sip_ipv4_tcp.pcap"  # SIP over TCP: a message's segments are cut with it


def indexed(tmp_path: Path) -> tuple[Path, Path, int]:
    capture = PCAPS / CAPTURE
    if not capture.exists():
        pytest.skip(f"real capture {CAPTURE} not found in {PCAPS}")
    meta = build(capture, tmp_path / "index", 0)
    return capture, tmp_path / "index", int(meta["frames"])


async def test_the_cut_matches_what_tshark_matches_over_the_whole_file(catalogue: Catalogue, tmp_path: Path) -> None:
    capture, index, frames = indexed(tmp_path)
    for display_filter in ('sip && sip.Method == "INVITE"', "sip && sip.Status-Code >= 200",
                           'sip && sip.CSeq.method == "BYE"'):
        layers = required_layers(display_filter, catalogue.kinds(display_filter))
        assert layers == ("sip",)
        found = await matching(capture, index, frames, base_argv(capture, [], []), display_filter, layers, 1000)
        assert found.numbers == oracle.matching(capture, display_filter) and found.numbers, display_filter
        assert 0 < found.cut_frames <= frames


async def test_a_filter_tshark_refuses_and_too_many_matches_are_coded_errors(catalogue: Catalogue,
                                                                              tmp_path: Path) -> None:
    capture, index, frames = indexed(tmp_path)
    argv = base_argv(capture, [], [])
    with pytest.raises(DiagdError) as refused:
        await matching(capture, index, frames, argv, 'sip.Method === "INVITE" ===', ("sip",), 1000)
    assert refused.value.code == ErrorCode.INVALID_FILTER
    wanted = oracle.matching(capture, "sip")
    with pytest.raises(DiagdError) as many:
        await matching(capture, index, frames, argv, "sip.Method || sip.Status-Code", ("sip",), len(wanted) - 1)
    assert many.value.code == ErrorCode.OUTPUT_TOO_LARGE and many.value.details["limit"] == len(wanted) - 1
    # No frame carries SCTP, so no tshark reads the filter over a cut: it is still checked, never "no match".
    with pytest.raises(DiagdError) as wrong:
        await matching(capture, index, frames, argv, 'sctp.port == "x"', ("sctp",), 1000)
    assert wrong.value.code == ErrorCode.INVALID_FILTER
    assert not list(index.parent.glob("*.partial-*")), "the cut's folder is removed"


async def test_a_file_the_index_cannot_cut_is_left_to_the_loaded_capture(tmp_path: Path) -> None:
    """Decryption secrets in the file (a block a cut would lose): not narrowed, and said so with
    `index_unanswered`, which sends the tool to the loaded capture (tools.frames_by_filter)."""
    capture, _, _ = indexed(tmp_path)
    secrets = tmp_path / "keylog.txt"
    secrets.write_text(f"CLIENT_RANDOM {'00' * 32} {'00' * 48}\n")
    with_secrets = tmp_path / "with_secrets.pcapng"
    subprocess.run(["editcap", "--inject-secrets", f"tls,{secrets}", str(capture), str(with_secrets)], check=True,
                   capture_output=True)
    meta = build(with_secrets, tmp_path / "index2", 0)
    with pytest.raises(DiagdError) as unanswered:
        await matching(with_secrets, tmp_path / "index2", int(meta["frames"]), base_argv(with_secrets, [], []),
                       'sip.Method == "INVITE"', ("sip",), 1000)
    assert unanswered.value.code == ErrorCode.NOT_FOUND and unanswered.value.details["index_unanswered"]
    assert "cannot narrow" in unanswered.value.message


def test_the_catalogue_sees_names_behind_a_minus_in_a_range_and_after_a_character_constant() -> None:
    """Catalogue.kinds (what a single pass or a cut may answer is decided on its names) reads a name
    written after a unary minus or as a range's bound, and skips a character constant holding a quote as
    one constant."""
    cat = Catalogue({"udp.stream": ("Stream index", "FT_UINT32", "udp"), "dns.id": ("ID", "FT_UINT16", "dns")},
                    {"dns": "DNS", "udp": "UDP"}, "test")
    assert [name for name, _, _ in cat.kinds("dns && -udp.stream == -1")] == ["dns", "udp.stream"]
    assert [name for name, _, _ in cat.kinds("dns.id in {0..udp.stream}")] == ["dns.id", "udp.stream"]
    assert [name for name, _, _ in cat.kinds("dns.id != '\"' && udp.stream == 1 && dns.id == \"x'y\"")] == [
        "dns.id", "udp.stream"]


async def test_a_tunnel_fragmented_outside_is_cut_with_its_first_fragment(tmp_path: Path) -> None:
    """GTP-U whose outer IPv4 packet is fragmented (real frames: DNS inside GTP-U of a core capture): the
    first fragment shows the outer ends only, yet the DNS frame is reassembled from it, so it is cut too,
    and the narrowed matches are the whole file's."""
    source = PCAPS_EXTRA / "oaifed_cotsue_core.pcap"
    if not source.exists():
        pytest.skip(f"real capture {source.name} not found")
    data = bytearray(source.read_bytes())
    found = list(packets(data))
    numbers = oracle.matching(source, "gtp && dns")
    records: list[tuple[int, bytes | bytearray]] = []
    for at, number in enumerate(numbers[:4]):
        pieces = fragment_ipv4(data, found[number - 1], 16)  # 16 bytes: UDP and GTP-U headers, no inner IP
        records += [(10**18 + at * 10**6 + k, frame) for k, frame in enumerate(pieces)]
    records.insert(0, (10**18 - 1, bytes(data[found[0].offset:found[0].offset + found[0].caplen])))
    capture = write_ns_pcap(tmp_path / "fragmented.pcap", found[0].linktype, records)
    meta = build(capture, tmp_path / "index", 0)
    display_filter = "dns && dns.flags.response == 0"
    wanted = oracle.matching(capture, display_filter)
    assert wanted, "the reassembled frames carry DNS"
    got = await matching(capture, tmp_path / "index", int(meta["frames"]), base_argv(capture, [], []),
                         display_filter, ("dns",), 1000)
    assert got.numbers == wanted


async def test_a_cut_tshark_cannot_read_within_its_memory_bound_is_left_to_the_loaded_capture(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel bounds tshark's address space over a cut (prlimit): past it, tshark is stopped and the
    filter is left to the loaded capture (`index_unanswered`), never an answer from part of the frames."""
    capture, index, frames = indexed(tmp_path)
    monkeypatch.setattr(workspace, "CUT_MAX_AS", 32 * 2**20)  # less than tshark needs to start
    with pytest.raises(DiagdError) as unanswered:
        await matching(capture, index, frames, base_argv(capture, [], []), "sip && sip.Method", ("sip",), 1000)
    assert unanswered.value.code == ErrorCode.NOT_FOUND and unanswered.value.details["index_unanswered"]
    assert "as when it needs more than 32 MB" in unanswered.value.message
