"""Port decode-as rules checked against what each conversation carries, so that no rule hides traffic.

`tcp.port==7777,http2` makes tshark parse every conversation on 7777 as HTTP/2: on a core whose SBI
is HTTP/1.1 on 7777 that turns every SBI message into malformed HTTP/2, and `http` matches nothing.
So before a port rule to HTTP/2 (or HTTP) is applied, one tshark pass without any rule reads the
first bytes of every conversation that could be concerned (`Probes.probe`): the HTTP/2 connection preface
or a run of valid HTTP/2 frame headers is HTTP/2, a request or status line is HTTP/1.x. Then
(`check`):

- every conversation with payload on the port carries the rule's protocol: the rule as given;
- none does: the rule is left out, and the answer says what the port carries instead;
- some do: tshark has no decode-as per conversation (its table is `tcp.port`, tried for the server
  port first, then the lower port, then the higher), so the rule is applied per conversation
  through its client port (`tcp.port==<client>,http2`). That is exact when neither the server port
  nor the client port has a dissector of its own (`tshark -G decodes`) and no other conversation
  uses that client port; a conversation where that does not hold is left alone, and said why.

Rules of any other protocol or table are applied as given. The findings also feed `pcap_info`
(`sbi_ports`: "HTTP/2 on tcp/7777 needs decode-as: applied") and the hints of empty answers, which
name only rules that change nothing but the HTTP/2 conversations.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import re
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from diagd.actors._paths import replace_whole
from diagd.actors._subprocess import head, run
from diagd.actors.pcap.shark.tshark import TRUNCATED
from diagd.actors.pcap.shark.wireshark import Catalogue
from diagd.protocol.errors import DiagdError, ErrorCode

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HTTP1 = re.compile(rb"^(?:[A-Z][A-Z-]{2,15} \S+ HTTP/1\.[01]\r?\n|HTTP/1\.[01] [1-5][0-9][0-9][ \r\n])")
HTTP1_REQUEST = re.compile(rb"^[A-Z][A-Z-]{2,15} \S+ HTTP/1\.[01]\r?\n")
KEEP_BYTES = 128  # of a conversation's first two segments each way
CHECKED = {"http2": "HTTP/2", "http": "HTTP/1.1"}  # rule protocol -> what the conversation must carry
# HTTP/2 frame types (RFC 9113 §6) -> (on stream 0 only: True, never on 0: False, either: None; fixed length)
_FRAMES: dict[int, tuple[bool | None, int | None]] = {
    0: (False, None), 1: (False, None), 2: (False, 5), 3: (False, 4), 4: (True, None), 5: (False, None),
    6: (True, 8), 7: (True, None), 8: (None, 4), 9: (False, None)}


@dataclass
class Conversation:
    """One TCP conversation (tcp.stream) as the probe saw it, without any decode-as rule."""

    stream: int
    ends: tuple[str, str]  # "address:port" of the first segment's sender and receiver
    ports: tuple[int, int]
    segments: list[tuple[int, bytes, int]] = field(default_factory=list)  # (sender port, first bytes, length)
    layers: set[str] = field(default_factory=set)  # what tshark decodes above TCP without a rule
    client_port: int | None = None  # known from a preface or an HTTP/1 line
    carries: str = "other"

    def classify(self) -> None:
        firsts: dict[int, tuple[bytes, int]] = {}
        for sender, data, length in self.segments:
            firsts.setdefault(sender, (data, length))
            if data.startswith(PREFACE):
                self.carries, self.client_port = "HTTP/2", sender
                return
            if _HTTP1.match(data):
                self.carries = "HTTP/1.1"
                self.client_port = sender if HTTP1_REQUEST.match(data) else self.other(sender)
                return
        if firsts and all(h2_frames(data, length) for data, length in firsts.values()):
            self.carries = "HTTP/2"
        elif self.layers:
            self.carries = "/".join(sorted(self.layers))

    def other(self, port: int) -> int:
        return self.ports[1] if port == self.ports[0] else self.ports[0]

    def server_port(self, named: Iterable[int], shared: dict[int, int]) -> int:
        """The listening end: a port a rule names, else what the preface / request line says, else
        the port more conversations share, else the lower one."""
        for port in self.ports:
            if port in named:
                return port
        if self.client_port is not None:
            return self.other(self.client_port)
        return max(self.ports, key=lambda p: (shared.get(p, 0), -p))

    def describe(self) -> dict[str, Any]:
        return {"tcp.stream": self.stream, "ends": list(self.ends), "carries": self.carries}


def h2_frames(data: bytes, length: int) -> bool:
    """Whether a segment (its first bytes `data`, `length` in all) starts with valid HTTP/2 frame
    headers that chain up to its end (a frame may run on into the next segment)."""
    pos = 0
    while pos + 9 <= len(data):
        size, kind = int.from_bytes(data[pos:pos + 3], "big"), data[pos + 3]
        sid = int.from_bytes(data[pos + 5:pos + 9], "big")
        rule = _FRAMES.get(kind)
        if rule is None or sid >> 31:
            return False
        zero_only, fixed = rule
        if (zero_only is not None and zero_only != (sid == 0)) or (fixed is not None and size != fixed):
            return False
        if kind == 4 and size % 6:  # SETTINGS: 6 bytes a setting
            return False
        pos += 9 + size
    return pos > 0 and (pos >= length or len(data) < length)


@dataclass
class Probe:
    """What every TCP conversation that carries payload tshark leaves undecoded, HTTP, or any port
    of `named`, carries (tshark without a rule)."""

    conversations: dict[int, Conversation]
    named: tuple[int, ...]

    def on(self, port: int) -> list[Conversation]:
        return [c for c in self.conversations.values() if port in c.ports]

    def shared(self) -> dict[int, int]:
        counts: dict[int, int] = defaultdict(int)
        for conv in self.conversations.values():
            for port in set(conv.ports):
                counts[port] += 1
        return counts


@dataclass(eq=False)
class Probing:
    """A probe pass under way or done, shared by every call that wants it. It runs as a system task:
    a call that stops waiting (pcap_info answers a fresh capture without it) leaves it running, so the
    next call finds it done instead of starting the pass again."""

    done: trio.Event = field(default_factory=trio.Event)
    found: Probe | None = None
    error: DiagdError | None = None

    def result(self) -> Probe:
        if self.error is not None:
            raise self.error
        assert self.found is not None
        return self.found


# This module's version: a probe kept by another (its classes changed) is probed again.
_SOURCE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


class Probes:
    """The probe of each file version and ports: KEEP done (the least recently asked dropped) and those
    under way, shared by every call that wants one: the back end's (`facts.Wireshark.probes`), handed to
    its tools and its captures' sessions."""

    KEEP = 64

    def __init__(self, kept: Path | None = None) -> None:
        self._done: OrderedDict[tuple[str, tuple[int, ...]], Probe] = OrderedDict()
        self._running: dict[tuple[str, tuple[int, ...]], Probing] = {}
        # Probes written to disk (the KEEP newest): a restarted daemon's first NGAP answer from a capture's
        # index would otherwise wait for a pass over the whole file (40 s a GB) before its warnings.
        self._kept = kept

    def begin(self, path: Path, identity: str, named: Sequence[int]) -> Probing:
        """The probe of this file version and ports: kept, under way, or started now."""
        key = (identity, tuple(sorted(set(named))))
        if key in self._done:
            self._done.move_to_end(key)
            cached = Probing(found=self._done[key])
            cached.done.set()
            return cached
        running = self._running.get(key)
        if running is None:
            running = self._running[key] = Probing()
            trio.lowlevel.spawn_system_task(self._work, path, key, running)
        return running

    async def _work(self, path: Path, key: tuple[str, tuple[int, ...]], running: Probing) -> None:
        try:
            found = await trio.to_thread.run_sync(self._read_kept, key)
            if found is None:
                found = await _probe(path, key)
                await trio.to_thread.run_sync(self._keep, key, found)
            running.found = found
            self._done[key] = found
            if len(self._done) > self.KEEP:
                self._done.popitem(last=False)
        except DiagdError as exc:
            running.error = exc
        except Exception as exc:  # a system task must not raise: the waiters get the error
            running.error = DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                                       f"tshark could not read the conversations to check a decode-as rule: {exc}")
        finally:
            self._running.pop(key, None)
            running.done.set()

    def _kept_file(self, key: tuple[str, tuple[int, ...]]) -> Path | None:
        if self._kept is None:
            return None
        return self._kept / (hashlib.sha256(repr((key, _SOURCE)).encode()).hexdigest()[:24] + ".pickle")

    def _read_kept(self, key: tuple[str, tuple[int, ...]]) -> Probe | None:
        """The probe of this file version (device, inode, size, mtime) and ports a daemon wrote before."""
        kept = self._kept_file(key)
        if kept is None:
            return None
        try:
            with open(kept, "rb") as f:
                found = pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception:  # whatever a damaged file raises: probed again
            kept.unlink(missing_ok=True)
            return None
        return found if isinstance(found, Probe) and found.named == key[1] else None

    def _keep(self, key: tuple[str, tuple[int, ...]], found: Probe) -> None:
        kept = self._kept_file(key)
        if kept is None:
            return
        with contextlib.suppress(OSError):
            kept.parent.mkdir(parents=True, exist_ok=True)
            replace_whole(kept, pickle.dumps(found, protocol=pickle.HIGHEST_PROTOCOL))
            for old in sorted(kept.parent.glob("*.pickle"), key=lambda p: p.stat().st_mtime)[:-self.KEEP]:
                old.unlink(missing_ok=True)

    async def probe(self, path: Path, identity: str, named: Sequence[int]) -> Probe:
        """One tshark pass, without any decode-as rule (kept per file version and ports)."""
        running = self.begin(path, identity, named)
        await running.done.wait()
        return running.result()


async def _probe(path: Path, key: tuple[str, tuple[int, ...]]) -> Probe:
    wanted = "data || http || http2" + (f" || tcp.port in {{{', '.join(map(str, key[1]))}}}" if key[1] else "")
    argv = ["tshark", "-r", str(path), "-n", "-Y", f"tcp.len > 0 && ({wanted})", "-T", "fields",
            "-E", "occurrence=l", "-E", "separator=/t"]
    for name in ("tcp.stream", "tcp.srcport", "tcp.dstport", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst",
                 "tcp.len", "frame.protocols", "tcp.payload"):
        argv += ["-e", name]
    conversations: dict[int, Conversation] = {}

    def take(line: str) -> None:
        cells = line.split("\t")
        if len(cells) < 10 or not cells[0].isdigit() or not cells[1].isdigit() or not cells[2].isdigit():
            return
        stream, sport, dport = int(cells[0]), int(cells[1]), int(cells[2])
        conv = conversations.get(stream)
        if conv is None:
            src, dst = cells[3] or cells[5], cells[4] or cells[6]
            conv = conversations[stream] = Conversation(stream, (f"{src}:{sport}", f"{dst}:{dport}"), (sport, dport))
        layers = cells[8].split(":")
        if "tcp" in layers:
            conv.layers.update(x for x in layers[layers.index("tcp") + 1:] if x not in ("tcp.segments", "data"))
        if sum(1 for s in conv.segments if s[0] == sport) < 2:
            conv.segments.append((sport, bytes.fromhex(cells[9][:KEEP_BYTES * 2]),
                                  int(cells[7]) if cells[7].isdigit() else 0))

    done = await head(argv, None, max_line=1 << 26, on_line=take)
    if done.returncode != 0 and not conversations and TRUNCATED not in done.stderr:  # a cut-short file: what there is
        messages = [x for x in done.stderr.splitlines() if x and not x.startswith("Running as user")]
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "tshark could not read the conversations to check a "
                         "decode-as rule: " + "\n".join(messages)[-2000:], exit_code=done.returncode)
    for conv in conversations.values():
        conv.classify()
    return Probe(conversations, key[1])


async def registered_ports(cat: Catalogue) -> frozenset[int]:
    """TCP ports that have a dissector of their own in tshark's tables (`tshark -G decodes`): read once
    per tshark version, kept with its catalogue."""
    if cat.tcp_decodes is None:
        out = (await run(["tshark", "-G", "decodes"])).out
        cat.tcp_decodes = frozenset(int(c[1]) for c in (line.split("\t") for line in out.splitlines())
                                    if len(c) >= 3 and c[0] == "tcp.port" and c[1].isdigit())
    return cat.tcp_decodes


async def streams_using(path: Path, ports: Iterable[int]) -> dict[int, set[int]]:
    """port -> every tcp.stream with that port at either end (one tshark pass)."""
    wanted = sorted(set(ports))
    argv = ["tshark", "-r", str(path), "-n", "-Y", f"tcp.port in {{{', '.join(map(str, wanted))}}}", "-T", "fields",
            "-E", "occurrence=l", "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.dstport"]
    users: dict[int, set[int]] = {p: set() for p in wanted}
    seen: set[tuple[str, ...]] = set()

    def take(line: str) -> None:
        cells = tuple(line.split("\t"))
        if len(cells) == 3 and cells not in seen and all(c.isdigit() for c in cells):
            seen.add(cells)
            for port in (int(cells[1]), int(cells[2])):
                if port in users:
                    users[port].add(int(cells[0]))

    await head(argv, None, on_line=take)
    return users


@dataclass(frozen=True)
class PortCheck:
    """What became of one requested port rule, and why."""

    rule: str  # as requested
    port: int
    protocol: str  # the rule's protocol
    applied: tuple[str, ...]  # the rules diagd applies for it (the rule itself, per-conversation ones, none)
    verdict: str  # "applied" | "applied per conversation" | "not applied"
    summary: str
    matching: tuple[int, ...] = ()  # tcp.stream of the conversations that carry the rule's protocol
    left_alone: tuple[tuple[int, str], ...] = ()  # (tcp.stream, what it carries / why it was left alone)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "verdict": self.verdict, "applied": list(self.applied),
                               "summary": self.summary}
        if self.left_alone:
            out["left_alone"] = [{"tcp.stream": s, "why": why} for s, why in self.left_alone[:20]]
            if len(self.left_alone) > 20:
                out["left_alone_more"] = len(self.left_alone) - 20
        return out


def port_of(table: str, value: str, proto: str) -> int | None:
    """The single TCP port a rule checked here names (None: a rule applied as given)."""
    return int(value) if table == "tcp.port" and value.isdigit() and proto in CHECKED else None


async def check(path: Path, identity: str, rules: Sequence[tuple[str, str, str, str]],
                cat: Catalogue, probes: Probes) -> tuple[list[str], list[PortCheck]]:
    """(rules to apply, what was checked) for the requested rules, each (rule, table, value, protocol);
    `cat`: the tshark's catalogue the rules were parsed against; `probes`: the back end's."""
    ports = [p for _, table, value, proto in rules if (p := port_of(table, value, proto)) is not None]
    if not ports:
        return [rule for rule, *_ in rules], []
    found = await probes.probe(path, identity, ports)
    registered = await registered_ports(cat)
    applied: list[str] = []
    checks: list[PortCheck] = []
    for rule, table, value, proto in rules:
        port = port_of(table, value, proto)
        if port is None:
            applied.append(rule)
            continue
        one = await _check_port(path, found, registered, rule, port, proto)
        checks.append(one)
        applied += one.applied
    return list(dict.fromkeys(applied)), checks


async def _check_port(path: Path, found: Probe, registered: frozenset[int], rule: str, port: int,
                      proto: str) -> PortCheck:
    want = CHECKED[proto]
    on = found.on(port)
    matching = [c for c in on if c.carries == want]
    others = [c for c in on if c.carries != want]
    where = f"tcp/{port}"
    if not others:
        summary = (f"{want} on {where} needs decode-as: applied ({len(matching)} conversations)" if matching else
                   f"no conversation on {where} carries payload: {rule} applied, it changes nothing")
        return PortCheck(rule, port, proto, (rule,), "applied", summary, tuple(c.stream for c in matching))
    kinds = ", ".join(sorted({c.carries for c in others}))
    if not matching:
        summary = (f"{kinds} on {where}: " + ("no decode-as needed; " if all(c.carries in CHECKED.values()
                                                                             for c in others) else "")
                   + f"{want} not found in any of its {len(others)} conversations, so not decoded as {proto}")
        return PortCheck(rule, port, proto, (), "not applied", summary, (),
                         tuple((c.stream, f"carries {c.carries}") for c in others))
    left = [(c.stream, f"carries {c.carries}") for c in others]
    applied: list[str] = []
    kept: list[int] = []
    if port in registered:
        left += [(c.stream, f"tcp/{port} has a dissector of its own, tried before a client port")
                 for c in matching]
    else:
        clients = {c.stream: c.other(port) for c in matching}
        users = await streams_using(path, set(clients.values()))
        ours = set(clients)
        for stream, client in sorted(clients.items()):
            if client in registered or client == port:
                left.append((stream, f"its client port {client} has a dissector of its own"))
            elif not users.get(client, set()) <= ours:
                left.append((stream, f"its client port {client} is also used by another conversation"))
            else:
                applied.append(f"tcp.port=={client},{proto}")
                kept.append(stream)
    summary = (f"{want} on {where} needs decode-as: applied per conversation to {len(kept)} of {len(on)} "
               f"conversations ({kinds} in {len(others)} left alone)" if kept else
               f"{want} on {where} in {len(matching)} conversations, {kinds} in {len(others)}: not applied, "
               "no rule shows the one without hiding the other (see left_alone)")
    return PortCheck(rule, port, proto, tuple(dict.fromkeys(applied)), "applied per conversation" if kept
                     else "not applied", summary, tuple(kept), tuple(sorted(left)))


MAX_PORTS = 20


def sbi_ports(found: Probe, checks: Sequence[PortCheck]) -> list[dict[str, Any]]:
    """HTTP/1.1 and HTTP/2 by server port, and whether each needs (and got) a decode-as rule."""
    shared = found.shared()
    by_port: dict[int, list[Conversation]] = defaultdict(list)
    for conv in found.conversations.values():
        if conv.carries in CHECKED.values():
            by_port[conv.server_port(found.named, shared)].append(conv)
    rows = []
    for port, convs in sorted(by_port.items()):
        kinds = sorted({c.carries for c in convs})
        mine = [c for c in checks if c.port == port]
        undecoded = [c for c in convs if c.carries == "HTTP/2" and "http2" not in c.layers]
        if mine:
            verdict, summary = mine[0].verdict, mine[0].summary
        elif undecoded:
            verdict = "not applied"
            summary = f"HTTP/2 on tcp/{port} needs decode-as: not applied ({advice(found, port)})"
        else:
            verdict = "not needed"
            summary = f"{' and '.join(kinds)} on tcp/{port}: no decode-as needed"
        rows.append({"port": port, "transport": "tcp", "carries": kinds, "conversations": len(convs),
                     "decode_as": verdict, "summary": summary})
    return rows[:MAX_PORTS]


def advice(found: Probe, port: int) -> str:
    """The decode-as that shows the HTTP/2 on `port` and hides nothing (the client ports when the
    port also carries something else)."""
    on = found.on(port)
    h2 = [c for c in on if c.carries == "HTTP/2"]
    if len(h2) == len(on):
        return f"decode_as=tcp.port=={port},http2"
    clients = sorted({c.other(port) for c in h2})
    shown = ", ".join(f"tcp.port=={p},http2" for p in clients[:6]) + (" ..." if len(clients) > 6 else "")
    return (f"it also carries {', '.join(sorted({c.carries for c in on if c not in h2}))}: decode_as per "
            f"conversation, {shown}, or profile 5gc-lab, which diagd applies to the HTTP/2 conversations only")


def http2_hint(found: Probe, checks: Sequence[PortCheck]) -> str:
    """Why no HTTP/2 shows, by what the conversations carry; names no rule that would hide traffic."""
    rows = sbi_ports(found, checks)
    needs = [r["summary"] for r in rows if r["decode_as"] == "not applied" and "HTTP/2" in r["carries"]]
    if needs:
        return "; ".join(needs)
    http1 = [f"tcp/{r['port']}" for r in rows if "HTTP/1.1" in r["carries"]]
    http2 = [f"tcp/{r['port']}" for r in rows if "HTTP/2" in r["carries"]]
    text = (f"HTTP/2 is on {', '.join(http2)} and decoded there" if http2 else
            "no TCP conversation here carries HTTP/2 (checked the first bytes of each)")
    if http1:
        text += f"; HTTP/1.1 is on {', '.join(http1)} (filter http), which needs no decode-as"
    return text
