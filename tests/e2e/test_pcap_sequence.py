"""pcap_sequence_diagram through the real shim and daemon, every arrow checked against `tshark -T fields`.

For every corpus capture that carries NGAP (each UE context, each PDU session), SIP, Diameter or HTTP/2
(one followed flow of each), the diagram is read back line by line (a grammar-level reader that
accepts only the forms diagd writes), parsed by the real Mermaid parser when it is installed, and its
arrows must equal, in order, one row per frame of tshark's own answer for the same frames: frame
number, innermost IP source and destination, and Wireshark's Protocol and Info columns.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from diagd.actors.pcap.engine.session import MAX_FILTER_CHARS
from tests.actors.pcap.test_ngap_fields import ue_keys
from tests.conftest import DIAGD, DaemonProcess, start_daemon
from tests.e2e.test_pcap import make_env
from tests.pcaps import PCAPS
from tests.support import mermaid, ngap_fields_oracle, ngap_oracle, pcap_oracle
from tests.support.pcapedit import readdress_ipv4, transplant

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]

HANG_GUARD_S = 600  # not a measurement: only stops a test that hangs
PREFS = ["-o", "sctp.association_index:TRUE", "-o", "nas-5gs.null_decipher:TRUE"]
SBI = "tcp.port==7777,http2"  # MANIFEST: HTTP/2 SBI on 7777 is never auto-detected by tshark 4.0
ORACLE_FIELDS = ["frame.number", "ip.src", "ipv6.src", "ip.dst", "ipv6.dst", "_ws.col.Protocol", "_ws.col.Info"]
# A failure by its own content: a reject, failure or status message by its type (TS 24.501 8.2/8.3), NGAP
# NASNonDeliveryIndication (19) and ErrorIndication (9), an unsuccessful outcome, or a failure cause or status.
FAILED = ("nas_5gs.mm.message_type in {0x44, 0x4d, 0x58, 0x59, 0x5f, 0x64} || "
          "nas_5gs.sm.message_type in {0xc3, 0xca, 0xcd, 0xd2, 0xd6} || ngap.procedureCode in {9, 19} || "
          "ngap.unsuccessfulOutcome_element || nas_5gs.mm.5gmm_cause || nas_5gs.sm.5gsm_cause > 36 || "
          "nas_5gs.sm.5gsm_cause < 36 || pfcp.cause > 1 || http2.headers.status >= 400 || "
          "http.response.code >= 400 || sip.Status-Code >= 400 || diameter.Result-Code >= 3000 || "
          "diameter.Experimental-Result-Code >= 3000")
EXTRA = PCAPS.parent / "pcaps-extra"
SCTP_CHUNKS = ("SACK", "INIT", "INIT_ACK", "COOKIE_ECHO", "COOKIE_ACK", "HEARTBEAT", "HEARTBEAT_ACK")


def corpus() -> list[Path]:
    if not PCAPS.is_dir():
        pytest.skip(f"the shared capture corpus is not in {PCAPS}")
    return sorted(PCAPS.glob("*.pcap*"))


def decode(path: Path) -> list[str]:
    return [SBI] if path.name.endswith("_sbi.pcap") else []


def tshark(path: Path, flt: str, fields: list[str]) -> list[list[str]]:
    argv = ["tshark", "-r", str(path), "-n", "-2", *PREFS, *[a for d in decode(path) for a in ("-d", d)],
            "-Y", flt, "-T", "fields", *[a for f in fields for a in ("-e", f)]]
    def run() -> str:  # kept on disk (tests/support/pcap_oracle.cached_text): the same frames are asked often
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    out = pcap_oracle.cached_text(path, [*argv, pcap_oracle.config_key()], run)
    return [line.split("\t") for line in out.splitlines() if line]


def info_text(info: str) -> str:
    """The Info column as the diagram should show it, worked out here on its own: SCTP control chunks
    before the payload, Diameter hop-by-hop/end-to-end ids and the trailing ' | ' left out."""
    text = info.strip()
    while True:
        head = re.match(r"(\w+)(?: \([^)]*\))? ?,? ?", text)
        if not head or head.group(1) not in SCTP_CHUNKS or head.end() == len(text):
            break
        text = text[head.end():]
    text = re.sub(r" h2h=\S+ e2e=\S+", "", text)
    return text.rstrip(" |")


def expected_arrows(path: Path, flt: str, decided: frozenset[int] = frozenset()
                    ) -> list[tuple[int, str, str, str, bool]]:
    """tshark's row for each frame of `flt`; failed: by its own content, or it `decided` a failed verdict."""
    failed = {int(r[0]) for r in tshark(path, f"({flt}) && ({FAILED})", ["frame.number"])} | decided
    rows = []
    for number, ip_src, ip6_src, ip_dst, ip6_dst, proto, info in tshark(path, flt, ORACLE_FIELDS):
        src, dst = (ip_src or ip6_src).split(",")[-1], (ip_dst or ip6_dst).split(",")[-1]
        rows.append((int(number), src, dst, f"[{number}] {proto} {info_text(info)}", int(number) in failed))
    return rows


def shown(text: str) -> str:
    """What Mermaid-safe text diagd makes of a label: the characters Mermaid reads as syntax replaced."""
    table = str.maketrans({";": ",", "#": "no.", "<": "‹", ">": "›", "%": "pct", "{": "(", "}": ")", '"': "'",
                           "$": "＄"})
    text = " ".join(text.translate(table).split()).replace("--", "-").replace("->", "-›")
    return text if len(text) <= 90 else text[:89] + "…"


def address_of(name: str) -> str:
    """The address a lifeline's shown name ends in: 'AMF 10.0.0.1', 'AMF 10.0.0.1:38412', '[fd00::1]:7777'."""
    where = name.split(" ")[-1]
    if where.startswith("["):
        return where[1:where.index("]")]
    return where.rsplit(":", 1)[0] if where.count(":") == 1 else where


def check(answer: dict[str, Any], path: Path, flt: str, diagrams: list[str],
          decided: frozenset[int] = frozenset()) -> list[mermaid.Arrow]:
    """The diagram's arrows are tshark's rows for `flt`, exactly and in order."""
    diagrams.append(answer["diagram"])
    _, arrows = mermaid.read(answer["diagram"])
    expected = expected_arrows(path, flt, decided)
    assert answer["frames_matched"] == len(expected) and answer["left_out"] == 0
    got = [(a.frame, address_of(a.src), address_of(a.dst), a.text, a.failed) for a in arrows]
    assert got == [(n, s, d, shown(t), f) for n, s, d, t, f in expected], path.name
    return arrows


@pytest.fixture(scope="module")
def seq_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("seqd")
    env = make_env(root, f'[daemon]\nallowed_dirs = ["{PCAPS}", "{EXTRA}", "{root}"]\n')
    daemon = start_daemon(env)
    yield daemon
    daemon.stop()
    shutil.rmtree(env.runtime, ignore_errors=True)


@pytest.fixture(scope="module")
def diagrams() -> list[str]:
    """Every diagram the tests got; the real Mermaid parser reads them all in the module's last test."""
    seen: list[str] = []
    return seen


async def call(daemon: DaemonProcess, tool: str, **args: Any) -> tuple[bool, dict[str, Any]]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
    async with Client(params, mode="legacy") as client:
        with trio.fail_after(HANG_GUARD_S):
            result = await client.call_tool(tool, args)
    return result.is_error, json.loads(result.content[0].text)


async def diagram(daemon: DaemonProcess, path: Path, **args: Any) -> dict[str, Any]:
    failed, answer = await call(daemon, "pcap_sequence_diagram", pcap_path=str(path), decode_as=decode(path),
                                **{"max_arrows": 1000, **args})
    assert not failed, answer
    return answer


def frame_set(frames: list[int] | set[int]) -> str:
    return f"frame.number in {{{','.join(map(str, sorted(frames)))}}}"


def failed_verdicts(procedures: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """frame -> the reject and failure verdicts of ngap_ue_sessions(view=procedures) it decided."""
    found: dict[int, list[dict[str, Any]]] = {}
    for p in procedures:
        if p["outcome"] in ("reject", "failure"):
            found.setdefault(p["last_frame"], []).append(p)
    return found


def check_verdicts(arrows: list[mermaid.Arrow], verdicts: dict[int, list[dict[str, Any]]]) -> set[str]:
    """Each deciding message is a crossed arrow with a Note per verdict naming its rule id and clause (the
    procedures view's, which the diagram must not contradict); returns the rule ids."""
    by_frame = {a.frame: a for a in arrows}
    for frame, procedures in verdicts.items():
        arrow = by_frame[frame]
        assert arrow.failed, frame
        for p in procedures:
            clause = p["rule"].split(":")[0]
            assert any(f"rule {p['rule_id']}, {clause}" in note and note.startswith(f"{p['procedure']} {p['outcome']}")
                       for note in arrow.notes), (frame, p["rule_id"], arrow.notes)
    return {p["rule_id"] for procedures in verdicts.values() for p in procedures}


async def test_every_ue_context_and_pdu_session_is_drawn_as_tshark_shows_its_frames(
        seq_daemon: DaemonProcess, diagrams: list[str]) -> None:
    """The frames of each drawing are chosen by tshark, not by diagd: a UE context's are the frames whose
    NGAP PDU carries its association and AMF/RAN UE NGAP ids (tests/support/ngap_fields_oracle); a PDU
    session's lie within the frames of that UE's PDUs carrying its PDU session id (NAS or N2; bundled
    SCTP chunks split first) and include every one carrying its 5GSM establishment messages or N2 setup.
    A PDU session's also holds every message its procedures' verdicts rest on (a 5GMM STATUS names no
    session) and the PFCP and SBI messages linked to them (`n4_sbi`), and nothing else. The message that
    decided a reject or failure is `-x` with a Note naming the rule."""
    checked, noted, linked = 0, set(), 0
    for path in corpus():
        if not tshark(path, "ngap && sctp", ["frame.number"]):
            continue
        oracle = ngap_fields_oracle.answer(path)
        rows, owners = ngap_oracle.owned_rows(path)  # one row per NGAP PDU (bundles split), with its UE
        _, ues = await call(seq_daemon, "ngap_ue_sessions", pcap_path=str(path), decode_as=decode(path))
        _, viewed = await call(seq_daemon, "ngap_ue_sessions", pcap_path=str(path), decode_as=decode(path),
                               view="procedures")
        procedures = {u["ue"]: u["procedures"] for u in viewed["ues"]}
        keys = ue_keys(ues)
        for ue in ues["ues"]:
            want = oracle.ues[keys[ue["ue"]]]["frames"]
            verdicts = failed_verdicts(procedures[ue["ue"]])
            answer = await diagram(seq_daemon, path, ue=ue["ue"])
            arrows = check(answer, path, frame_set(want), diagrams, frozenset(verdicts))
            assert [a.frame for a in arrows] == want
            noted |= check_verdicts(arrows, verdicts)
            roles = {p["address"]: p["role"] for p in answer["participants"]}
            assert roles[ue["gnb"].rsplit(":", 1)[0]] == "gNB" and roles[ue["amf"].rsplit(":", 1)[0]] == "AMF"
            checked += 1
        _, sessions = await call(seq_daemon, "ngap_pdu_session_summary", pcap_path=str(path),
                                 decode_as=decode(path))
        for s in sessions["sessions"]:
            psi, owner = s["pdu_session_id"], keys[s["ue"]]
            mine = [r for r, o in zip(rows, owners, strict=True) if o == owner
                    and psi in r.ints("nas_5gs.pdu_session_id") + r.ints("ngap.pDUSessionID")]
            carrying = {r.frame for r in mine}
            establishing = {r.frame for r in mine if {0xC1, 0xC2, 0xC3} & set(r.ints("nas_5gs.sm.message_type"))
                            or (r.proc in (14, 29) and psi in r.ints("ngap.pDUSessionID"))}
            session_procedures = [p for p in procedures[s["ue"]] if p.get("pdu_session_id") == psi]
            verdict_frames = {f for p in session_procedures for f in p["frames"]}
            core = {f for p in session_procedures for m in p.get("n4_sbi", [])
                    for f in (m["frame"], m["response_frame"]) if f is not None}
            answer = await diagram(seq_daemon, path, ue=s["ue"], pdu_session_id=psi)
            drawn = {a.frame for a in mermaid.read(answer["diagram"])[1]}
            assert establishing and establishing | verdict_frames | core <= drawn, (path.name, s["ue"], psi)
            assert drawn <= carrying | verdict_frames | core, (path.name, s["ue"], psi)
            verdicts = failed_verdicts(session_procedures)
            # each arrow is tshark's row for its frame
            arrows = check(answer, path, frame_set(drawn), diagrams, frozenset(verdicts))
            noted |= check_verdicts(arrows, verdicts)
            assert sorted(m["frame"] for m in answer["n4_sbi"]) == sorted(
                m["frame"] for p in session_procedures for m in p.get("n4_sbi", []))
            linked += bool(core)
            checked += 1
    if not checked:
        pytest.skip("no corpus capture carries NGAP")
    # The corpus's failed verdicts are all named on their deciding message, among them the 5GMM STATUS a PDU
    # session's failure rests on; and PDU sessions of captures merged with N4/SBI draw their PFCP and SBI.
    assert {"pdu-5gmm-status", "pdu-reject", "registration-reject", "authentication-failure"} <= noted, noted
    assert linked >= 1


FOLLOWS = {  # the key a flow is followed by, and the tshark filter that gives its frames
    "sip.Call-ID": lambda v: f'sip.Call-ID == "{v[0]}"',
    "diameter.Session-Id": lambda v: f'diameter.Session-Id == "{v[0]}"',
}


async def test_a_followed_sip_diameter_or_http2_flow_is_drawn_as_tshark_shows_it(
        seq_daemon: DaemonProcess, diagrams: list[str]) -> None:
    checked = set()
    for path in corpus():
        for field in ("sip.Call-ID", "diameter.Session-Id", "http2.streamid"):
            flt = f"{field} && !(http2.streamid == 0)" if field == "http2.streamid" else field
            rows = tshark(path, flt, ["frame.number", field, "tcp.stream"])
            if not rows:
                continue
            number, value, stream = rows[0][0], rows[0][1].split(","), rows[0][2]
            # pcap_follow's precedence: an HTTP/2 stream, then a Session-Id, then a Call-ID.
            on_http2 = tshark(path, f"frame.number == {number} && http2.streamid", ["frame.number"])
            if field != "http2.streamid" and on_http2:
                continue
            if field == "http2.streamid":
                oracle = f"tcp.stream == {stream} && http2.streamid == {next(s for s in value if s != '0')}"
            else:
                oracle = FOLLOWS[field](value)
            answer = await diagram(seq_daemon, path, frame_number=int(number))
            check(answer, path, oracle, diagrams)
            checked.add(field)
    assert checked == {"sip.Call-ID", "diameter.Session-Id", "http2.streamid"}, checked


async def test_roles_come_from_pfcp_and_sbi_and_failures_are_crossed_arrows(
        seq_daemon: DaemonProcess, diagrams: list[str]) -> None:
    n4 = PCAPS / "adrian_n4_upf_timeout_n4.pcap"
    answer = await diagram(seq_daemon, n4, display_filter="pfcp.msg_type == 50")
    check(answer, n4, "pfcp.msg_type == 50", diagrams)
    assert {p["address"]: p["role"] for p in answer["participants"]} == {"10.53.0.12": "SMF", "10.53.0.13": "UPF"}
    sbi = PCAPS / "adrian_sbi_nssf_reject_sbi.pcap"
    answer = await diagram(seq_daemon, sbi, display_filter="http2.type == 1")
    arrows = check(answer, sbi, "http2.type == 1", diagrams)
    assert {a.frame for a in arrows if a.failed} == {786, 791, 941, 944, 1088, 1091}
    assert "Note right of" in answer["diagram"] and "HTTP 403" in answer["diagram"]
    reject = PCAPS / "adrian_registration_reject.pcap"
    answer = await diagram(seq_daemon, reject, display_filter="nas_5gs.mm.5gmm_cause")
    assert all(a.failed for a in check(answer, reject, "nas_5gs.mm.5gmm_cause", diagrams))


# An end's role by what it speaks, worked out here from tshark's fields alone: the SCTP end on 38412 of an
# NGAP frame is the AMF and the other the gNB; a PFCP session request's sender is the SMF and its receiver
# the UPF (responses the other way); the server end of an SBI request is the NF its :path service names.
PFCP_REQUESTS, PFCP_RESPONSES = {"50", "52", "54", "57"}, {"51", "53", "55", "56"}
END_FIELDS = ["frame.number", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "sctp.srcport", "sctp.dstport",
              "udp.srcport", "udp.dstport", "ngap.procedureCode", "pfcp.msg_type", "http2.header.name",
              "http2.header.value", "http.request.uri"]
End = tuple[str, str]


def frame_ends(path: Path, flt: str) -> tuple[dict[int, tuple[End, End]], dict[End, set[str]]]:
    """(frame -> (source end, destination end), end -> the roles tshark's fields give it)."""
    ends: dict[int, tuple[End, End]] = {}
    votes: dict[End, set[str]] = {}
    for row in tshark(path, flt, END_FIELDS):
        cell = dict(zip(END_FIELDS, [c.split(",") if c else [] for c in row], strict=True))
        proto = next(p for p in ("tcp", "sctp", "udp") if cell[f"{p}.srcport"])
        src = (cell["ip.src"][-1], cell[f"{proto}.srcport"][-1])
        dst = (cell["ip.dst"][-1], cell[f"{proto}.dstport"][-1])
        ends[int(row[0])] = (src, dst)
        said: list[tuple[End, str]] = []
        if cell["ngap.procedureCode"] and proto == "sctp":
            said += [(src, "AMF"), (dst, "gNB")] if src[1] == "38412" else [(src, "gNB"), (dst, "AMF")]
        if set(cell["pfcp.msg_type"]) & PFCP_REQUESTS:
            said += [(src, "SMF"), (dst, "UPF")]
        if set(cell["pfcp.msg_type"]) & PFCP_RESPONSES:
            said += [(src, "UPF"), (dst, "SMF")]
        paths = [v for n, v in zip(cell["http2.header.name"], cell["http2.header.value"], strict=False)
                 if n == ":path"] + cell["http.request.uri"]
        said += [(dst, m.group(1).upper()) for p in paths if (m := re.match(r"/n([a-z]+)-", p))]
        for end, role in said:
            votes.setdefault(end, set()).add(role)
    return ends, votes


def expected_names(ends: dict[int, tuple[End, End]], votes: dict[End, set[str]]) -> dict[End, str]:
    """Each end's lifeline name: its address's when the address is unambiguous (no two of its ends named
    differently, none talking to another), else 'ROLE address:port' for a named end, the address for the rest."""
    def role(end: End) -> str | None:
        return next(iter(votes[end])) if len(votes.get(end, ())) == 1 else None

    everyone = {e for pair in ends.values() for e in pair}
    names: dict[End, str] = {}
    for address in {a for a, _ in everyone}:
        mine = {e for e in everyone if e[0] == address}
        talking = any(s != d and s[0] == d[0] == address for s, d in ends.values())
        roles = {r for e in mine if (r := role(e))}
        if len(roles) <= 1 and not talking:
            found = set().union(*(votes.get(e, set()) for e in mine))
            names.update({e: f"{next(iter(found))} {address}" if len(found) == 1 else address for e in mine})
        else:
            names.update({e: f"{role(e)} {address}:{e[1]}" if role(e) else address for e in mine})
    return names


async def check_lifelines(daemon: DaemonProcess, path: Path, flt: str, decode_as: list[str],
                          diagrams: list[str]) -> set[str]:
    """Every arrow of the diagram goes between the lifelines its ends are named by, and none points to
    itself unless tshark shows one end on both sides; returns the lifelines' names."""
    failed, answer = await call(daemon, "pcap_sequence_diagram", pcap_path=str(path), display_filter=flt,
                                decode_as=decode_as, max_arrows=1000)
    assert not failed, answer
    diagrams.append(answer["diagram"])
    ends, votes = frame_ends(path, flt)
    names = expected_names(ends, votes)
    _, arrows = mermaid.read(answer["diagram"])
    assert [a.frame for a in arrows] == sorted(ends)
    for a in arrows:
        src, dst = ends[a.frame]
        assert (a.src, a.dst) == (names[src], names[dst]), (a.frame, src, dst)
        assert a.src != a.dst or src == dst, (a.frame, src, dst)
    return {p["name"] for p in answer["participants"]}


def all_in_one(root: Path, source: Path, addresses: dict[str, str]) -> Path:
    """`source` with the NFs' addresses mapped onto one: a real core's frames as an all-in-one core's."""
    data = bytearray(source.read_bytes())
    assert readdress_ipv4(data, addresses) > 0
    out = root / f"all_in_one_{source.name}"
    out.write_bytes(bytes(data))
    return out


async def test_nfs_sharing_an_address_are_told_apart_by_port_and_what_they_speak(
        seq_daemon: DaemonProcess, diagrams: list[str]) -> None:
    """An all-in-one core: NGAP, PFCP and SBI ends on one address are lifelines of their own, named by what
    they speak; no arrow points to itself. Three captures, each checked against tshark's own fields."""
    cotsue = EXTRA / "oaifed_cotsue_core.pcap"
    open5gs = EXTRA / "ngtester_initue_open5gs_amf_ngap_nas_sbi.pcap"
    if not (cotsue.exists() and open5gs.exists()):
        pytest.skip("pcaps-extra is not there")
    flt = "ngap || pfcp || ((http.request || http.response || http2.type == 1) && tcp.port in {7777, 8282, 8889})"
    # Real: OAI's AMF SBI (TCP 8282) and SMF (TCP 8889, PFCP 8805) share 192.168.122.197 and call each other
    # over HTTP/1.1 on it; the UPF (192.168.199.126) answers PFCP from 8805 and 45935.
    names = await check_lifelines(seq_daemon, cotsue, flt, [], diagrams)
    assert {"AMF 192.168.122.197:8282", "SMF 192.168.122.197:8889", "SMF 192.168.122.197:8805",
            "192.168.122.197", "UPF 192.168.199.126", "AMF 192.168.199.28", "gNB 192.168.199.241"} == names
    # The same frames with the gNB and the AMF's N2 address on 192.168.122.197 too: gNB, AMF (N2 and SBI)
    # and SMF on one address.
    root = Path(seq_daemon.env.root)
    path = all_in_one(root, cotsue, {"192.168.199.28": "192.168.122.197", "192.168.199.241": "192.168.122.197"})
    names = await check_lifelines(seq_daemon, path, flt, [], diagrams)
    assert {"gNB 192.168.122.197:60110", "AMF 192.168.122.197:38412", "AMF 192.168.122.197:8282",
            "SMF 192.168.122.197:8889", "SMF 192.168.122.197:8805", "192.168.122.197", "UPF 192.168.199.126"} == names
    # Open5GS over HTTP/2 (7777): both testers' gNBs moved onto the AMF's address; the AMF serves namf-comm
    # on 7777 there, and 172.30.10.5:7777 serves nsmf and nnrf alike (an SCP): it keeps its plain address.
    path = all_in_one(root, open5gs, {"172.30.200.0": "172.30.0.10", "172.30.200.2": "172.30.0.10"})
    names = await check_lifelines(seq_daemon, path, flt, [SBI], diagrams)
    assert {"gNB 172.30.0.10:50045", "gNB 172.30.0.10:51164", "AMF 172.30.0.10:38412", "AMF 172.30.0.10:7777",
            "172.30.0.10", "172.30.10.5"} == names


def long_contexts(root: Path, pairs: int) -> Path:
    """adrian_sandbox_n2 with UE 1's and UE 2's PDUSessionResourceSetupResponse (frames 25, 35) sent again
    `pairs` times each, alternately, on their association with the next uplink TSNs: two UE contexts of
    hundreds of frames, none of them consecutive."""
    source = PCAPS / "adrian_sandbox_n2.pcap"
    data = bytearray(source.read_bytes())
    last = float(tshark(source, "frame.number == 44", ["frame.time_epoch"])[0][0])
    tsn = int(tshark(source, "frame.number == 43", ["sctp.data_tsn_raw"])[0][0])
    for step in range(2 * pairs):
        transplant(data, 43, data, (25, 35)[step % 2], tsn=tsn + 1 + step, time=last + (step + 1) / 1000)
    out = root / f"long_contexts_{pairs}.pcap"
    out.write_bytes(bytes(data))
    return out


async def test_a_long_ue_context_is_drawn_in_pages_never_refused_for_its_own_filter(
        seq_daemon: DaemonProcess, diagrams: list[str]) -> None:
    """A UE context of 500+ frames: its frame list is longer than any filter sharkd takes. The diagram is cut at
    max_arrows and paged by next_offset; the pages, in order, are tshark's frames of the context, each arrow
    tshark's row; a display_filter narrows the context as tshark's does."""
    path = long_contexts(Path(seq_daemon.env.root), 500)
    oracle = ngap_fields_oracle.answer(path)
    _, ues = await call(seq_daemon, "ngap_ue_sessions", pcap_path=str(path))
    keys = ue_keys(ues)
    ue = next(u["ue"] for u in ues["ues"] if u["ue"].endswith("/ran-1"))
    want = oracle.ues[keys[ue]]["frames"]
    assert len(want) > 500 and len(frame_set(want)) > MAX_FILTER_CHARS  # main built this filter and refused it
    drawn: list[int] = []
    offset: int | None = 0
    while offset is not None:
        answer = await diagram(seq_daemon, path, ue=ue, max_arrows=200, offset=offset)
        _, arrows = mermaid.read(answer["diagram"])
        page = [a.frame for a in arrows]
        assert page == want[offset:offset + 200] and answer["frames_matched"] == len(want)
        assert answer["left_out"] == len(want) - len(page) and answer["offset"] == offset
        check_page(answer, path, page, diagrams)
        if answer["next_offset"] is not None:
            assert "cut at max_arrows=200" in answer["warnings"][0]
        drawn += page
        offset = answer["next_offset"]
    assert drawn == want
    # All at once (max_arrows 1000): asked in parts, each under the limit; the same frames.
    answer = await diagram(seq_daemon, path, ue=ue)
    assert [a.frame for a in mermaid.read(answer["diagram"])[1]] == want and answer["next_offset"] is None
    assert any("filters of at most" in w for w in answer["warnings"]), answer["warnings"]
    # Narrowed by a display filter: tshark's frames of the context that match it.
    flt = "ngap.procedureCode == 29"
    narrowed = [int(r[0]) for r in tshark(path, f"({frame_set(want)}) && ({flt})", ["frame.number"])]
    answer = await diagram(seq_daemon, path, ue=ue, display_filter=flt, max_arrows=100, offset=50)
    assert answer["frames_matched"] == len(narrowed) > 150
    assert [a.frame for a in mermaid.read(answer["diagram"])[1]] == narrowed[50:150]
    assert answer["next_offset"] == 150


def check_page(answer: dict[str, Any], path: Path, page: list[int], diagrams: list[str]) -> None:
    """Each arrow of a page is tshark's row for its frame."""
    diagrams.append(answer["diagram"])
    _, arrows = mermaid.read(answer["diagram"])
    got = [(a.frame, address_of(a.src), address_of(a.dst), a.text, a.failed) for a in arrows]
    assert got == [(n, s, d, shown(t), f) for n, s, d, t, f in expected_arrows(path, frame_set(page))]


async def test_a_diagram_is_cut_at_max_arrows_and_says_how_many_were_left_out(seq_daemon: DaemonProcess) -> None:
    path = PCAPS / "adrian_sandbox_n2.pcap"
    total = len(tshark(path, "sctp", ["frame.number"]))
    failed, answer = await call(seq_daemon, "pcap_sequence_diagram", pcap_path=str(path), display_filter="sctp",
                                max_arrows=5)
    assert not failed
    assert len(mermaid.read(answer["diagram"])[1]) == 5
    assert answer["frames_matched"] == total and answer["left_out"] == total - 5
    assert "cut at max_arrows=5" in answer["warnings"][0]


async def test_wrong_selections_are_coded_errors_with_close_matches(seq_daemon: DaemonProcess) -> None:
    path = str(PCAPS / "adrian_sandbox_n2.pcap")
    failed, answer = await call(seq_daemon, "pcap_sequence_diagram", pcap_path=path)
    assert failed and answer["code"] == "INVALID_ARGUMENT" and "frame_number" in answer["details"]["hint"]
    _, ues = await call(seq_daemon, "ngap_ue_sessions", pcap_path=path)
    known = ues["ues"][0]["ue"]
    failed, answer = await call(seq_daemon, "pcap_sequence_diagram", pcap_path=path, ue=known[:-1] + "9")
    assert failed and answer["code"] == "INVALID_ARGUMENT" and known in answer["details"]["did_you_mean"]
    failed, answer = await call(seq_daemon, "pcap_sequence_diagram", pcap_path=path, ue=known, pdu_session_id=99)
    assert failed and answer["code"] == "INVALID_ARGUMENT" and "pdu_session_ids" in answer["details"]
    failed, answer = await call(seq_daemon, "pcap_sequence_diagram", pcap_path=path, display_filter="ngap && nope")
    assert failed and answer["code"] == "INVALID_FILTER"


async def test_no_matching_frame_gives_an_empty_diagram_with_the_reason(seq_daemon: DaemonProcess) -> None:
    path = str(PCAPS / "heplify_sip_ipv4_tcp.pcap")
    failed, answer = await call(seq_daemon, "pcap_sequence_diagram", pcap_path=path, display_filter="pfcp")
    assert not failed and answer["arrows"] == 0 and "pfcp" in answer["reason"]
    assert answer["diagram"] == "sequenceDiagram\n"


def crafted_sip(path: Path, uri: str) -> Path:
    """A one-frame capture of a SIP INVITE whose Request-URI is `uri`, built with text2pcap from a hex dump."""
    msg = (f"INVITE {uri} SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK1\r\nFrom: <sip:a@b>;tag=1\r\n"
           "To: <sip:b@c>\r\nCall-ID: 1@x\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n").encode()
    dump = "".join(f"{i:06x} {msg[i:i + 16].hex(' ')}\n" for i in range(0, len(msg), 16))
    subprocess.run(["text2pcap", "-q", "-u", "5060,5060", "-4", "10.0.0.1,10.0.0.2", "-", str(path)],
                   input=dump.encode(), check=True, capture_output=True)
    return path


async def test_a_crafted_packet_cannot_inject_mermaid_into_the_diagram(seq_daemon: DaemonProcess) -> None:
    # Spaces end a SIP Request-URI, so every piece is written without one; tshark shows U+2028 as it is.
    uri = ('sip:$$\\fail{x}$$@a%%{init:{"securityLevel":"loose"}}%%#lt;script#gt;<br>x\u2028end\u0085note;'
           'click--x>>B')
    path = crafted_sip(seq_daemon.env.root / "crafted_sip.pcap", uri)
    assert "$$" in tshark(path, "sip", ["_ws.col.Info"])[0][0]  # the hostile text reaches Wireshark's column
    answer = await diagram(seq_daemon, path, display_filter="sip")
    _, arrows = mermaid.read(answer["diagram"])
    assert [a.frame for a in arrows] == [1] and "$$" not in answer["diagram"] and "%%" not in answer["diagram"]
    mermaid.require_parser()
    assert [v["ok"] for v in mermaid.parse([answer["diagram"]])] == [True]
    assert mermaid.render([answer["diagram"]]) == [{"ok": True}]


def test_every_diagram_of_this_module_parses_with_the_real_mermaid_parser(diagrams: list[str]) -> None:
    """Last in the module: every diagram the tests above got, read by the real parser."""
    mermaid.require_parser()
    if not diagrams:
        pytest.skip("no diagram was collected: run the whole module (the tests above fill the list)")
    verdicts = mermaid.parse(diagrams)
    bad = [(d, v) for d, v in zip(diagrams, verdicts, strict=True) if not v["ok"]]
    assert not bad, bad[:2]
