"""What Wireshark itself knows: its fields, protocols and version (`tshark -G`, read by
`read_catalogue`; the back end's `facts.Wireshark` keeps the one it read), decode-as rules checked
against them, and the capture identity (sha256) that keys a loaded worker (`Digests`, the back end's).
Everything here runs off the event loop (subprocesses, worker threads)."""

from __future__ import annotations

import difflib
import hashlib
import pickle
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from diagd.actors import heap
from diagd.actors._subprocess import run
from diagd.actors.pcap.shark.fieldtable import FieldTable, as_table
from diagd.protocol.errors import DiagdError, ErrorCode

# Wireshark's default packet-list columns, as `tshark -T fields -e _ws.col.<title>` names them. These
# pseudo-fields are not in `tshark -G fields`: tshark accepts any `_ws.col.<title>` and prints the
# column with that title (an unknown title prints nothing). diagd's workers and tshark runs use the
# default column set, spelled out with -o so that a user's own column preferences cannot change it.
COLUMN_FORMATS = {"No.": "%m", "Time": "%t", "Source": "%s", "Destination": "%d", "Protocol": "%p",
                  "Length": "%L", "Info": "%i"}
COLUMN_PREFIX = "_ws.col."
COLUMN_FIELDS = {COLUMN_PREFIX + title: fmt for title, fmt in COLUMN_FORMATS.items()}
_COLUMNS_LOWER = {name.lower(): name for name in COLUMN_FIELDS}


def column_format_pref(columns: dict[str, str] | None = None) -> str:
    """`-o` value that defines exactly these packet-list columns (title -> format)."""
    cols = COLUMN_FORMATS if columns is None else columns
    return "gui.column.format:" + ",".join(f'"{t}","{f}"' for t, f in cols.items())


# Words of a display filter (field and protocol names; also unquoted values) and its keywords. Strings and
# character constants ('"' is one) are skipped whole; a word may follow a unary minus (`-udp.stream`).
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'")
_WORD = re.compile(r"(?<![\w.:])[A-Za-z_][\w\-]*(?:\.[\w\-]+)*")
FILTER_KEYWORDS = frozenset({"and", "or", "not", "xor", "in", "contains", "matches", "eq", "ne", "gt", "lt", "ge", "le",
                       "any", "all", "bitwise_and", "true", "false"})


@dataclass
class Catalogue:
    # name -> (description, type, protocol); a plain dict (tests build small catalogues so) becomes a
    # compact FieldTable here: as ~233k dict entries it held ~100 MB of the daemon's heap (issue 12).
    fields: Mapping[str, tuple[str, str, str]]
    protocols: dict[str, str]  # filter name -> full name
    version: str
    # Field prefixes that are not a protocol's filter name, e.g. "nas_5gs" (fields nas_5gs.*)
    # -> "nas-5gs" (the protocol), so a layer may be named either way.
    prefix_protocols: dict[str, str] = field(default_factory=dict)
    # `fields` as the FieldTable it is made into.
    table: FieldTable = field(init=False, repr=False, compare=False)
    # The TCP ports that have a dissector of their own in this tshark's tables (`tshark -G decodes`), read
    # on first use (decode_check.registered_ports): a fact of the same tshark version, kept with the others.
    tcp_decodes: frozenset[int] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.fields = self.table = table = as_table(self.fields)
        votes: dict[str, dict[str, int]] = {}
        for name, (_, _, proto) in table.rows():
            prefix = name.split(".", 1)[0]
            if prefix not in self.protocols and proto in self.protocols:
                counts = votes.setdefault(prefix, {})
                counts[proto] = counts.get(proto, 0) + 1
        self.prefix_protocols = {prefix: max(counts, key=lambda p: counts[p]) for prefix, counts in votes.items()}

    def resolve_field(self, name: str) -> tuple[str | None, str | None]:
        """(canonical name or None, warning or None). Case-only mistakes become aliases."""
        if name in self.fields or name in self.protocols or name in COLUMN_FIELDS:
            return name, None
        # As {name.lower(): name for name in [*fields, *COLUMN_FIELDS]} answered: a column wins.
        alias = _COLUMNS_LOWER.get(name.lower()) or self.table.alias(name.lower())
        if alias is not None:
            return alias, f"field {name!r} is spelled {alias!r} in Wireshark; used {alias!r}"
        return None, None

    def suggestions(self, name: str) -> list[str]:
        if name.lower().startswith(COLUMN_PREFIX.lower()):
            # The few column names: list them all when no title is close, they are the whole choice.
            close = difflib.get_close_matches(name[len(COLUMN_PREFIX):], list(COLUMN_FORMATS), n=3, cutoff=0.6)
            return [COLUMN_PREFIX + t for t in close] or list(COLUMN_FIELDS)
        prefix = name.split(".", 1)[0].lower()
        table = self.table
        pool = [table.name(i) for i in table.with_prefix(prefix + ".", lower=True)] or list(table)
        return difflib.get_close_matches(name, pool, n=5, cutoff=0.6)

    def kinds(self, *expressions: str) -> tuple[tuple[str, str | None, str | None], ...]:
        """(name, type, protocol) of every name in display filters or field lists, for deciding what a
        single tshark pass may answer (first_page); (name, None, None) for a word that is neither a
        field nor a protocol (an unquoted value, a typo). Quoted strings are skipped."""
        found: dict[str, tuple[str, str | None, str | None]] = {}
        for expression in expressions:
            # A range's bounds may be names (`{0..udp.stream}`): read apart from the `..` between them.
            for name in _WORD.findall(_QUOTED.sub('""', expression).replace("..", " .. ")):
                if name.lower() in FILTER_KEYWORDS or name in found:
                    continue
                if name in self.protocols:
                    found[name] = (name, "FT_PROTOCOL", name)
                elif (entry := self.fields.get(name)) is not None:
                    found[name] = (name, entry[1], entry[2])
                else:
                    found[name] = (name, None, None)
        return tuple(found.values())

    def resolve_layer(self, name: str) -> str | None:
        """A protocol named by its filter name ("nas-5gs") or its fields' prefix ("nas_5gs"), in any case."""
        for candidate in (name, name.lower()):
            if candidate in self.protocols:
                return candidate
            if candidate in self.prefix_protocols:
                return self.prefix_protocols[candidate]
        return None


async def read_catalogue() -> Catalogue:
    """Wireshark's fields, protocols and version as this tshark lists them (`tshark -G`): read at each
    call (seconds of subprocesses and parsing), so kept by its caller: the back end's `facts.Wireshark`."""
    tshark = shutil.which("tshark")
    if tshark is None:
        raise DiagdError(ErrorCode.TSHARK_NOT_FOUND, "tshark is not installed",
                         fix="apt-get install tshark (scripts/setup.sh does it)")
    fields_out, protos_out, version_out = [await _tshark(tshark, *args)
                                           for args in (("-G", "fields"), ("-G", "protocols"), ("-v",))]
    # Parsed in a worker thread (~1 s of Python): the event loop keeps serving meanwhile. The
    # parse makes and drops ~1M small objects; the few thousand that last (protocol names,
    # non-ASCII fields) would sit scattered among them and keep ~100 MB of pymalloc arenas and
    # glibc heap alive for good. So the thread hands back the catalogue pickled (all its
    # objects freed), it is unpickled here into compact memory, and the heap is trimmed.
    blob = await trio.to_thread.run_sync(_parse_pickled, fields_out, protos_out, version_out)
    del fields_out, protos_out
    cat: Catalogue = pickle.loads(blob)
    del blob
    # Its text (~10 MB) to a file: lookups and searches read it from there (fieldtable.py).
    await trio.to_thread.run_sync(cat.table.spill)
    heap.trim()
    return cat


def _parse_pickled(fields_out: str, protos_out: str, version_out: str) -> bytes:
    return pickle.dumps(_parse(fields_out, protos_out, version_out), protocol=pickle.HIGHEST_PROTOCOL)


def _parse(fields_out: str, protos_out: str, version_out: str) -> Catalogue:
    names: list[str] = []
    descs: list[str] = []
    types: list[str] = []
    owners: list[str] = []
    protocols: dict[str, str] = {}
    for line in fields_out.splitlines():
        parts = line.split("\t")
        if parts[0] == "F" and len(parts) >= 5:
            names.append(parts[2])
            descs.append(parts[1])
            types.append(parts[3])
            owners.append(parts[4])
        elif parts[0] == "P" and len(parts) >= 3:
            protocols[parts[2]] = parts[1]
    for line in protos_out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            protocols[parts[2]] = parts[0]
    try:
        table = FieldTable(names, descs, types, owners)
    except ValueError:  # a name listed twice: keep the first position and the last value, as a dict does
        table = FieldTable.from_rows(zip(names, zip(descs, types, owners, strict=True), strict=True))
    return Catalogue(table, protocols, version_out.splitlines()[0].strip())


async def _tshark(tshark: str, *args: str) -> str:
    done = await run([tshark, *args], timeout_s=120)
    if done.returncode != 0 or not done.stdout:
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"tshark {' '.join(args)} failed",
                         stderr=done.stderr.strip()[-1000:], exit_code=done.returncode)
    return done.out


@dataclass(eq=False)
class _Digest:
    """One file version's sha256, computed once in a worker thread; waiters share it."""

    done: trio.Event = field(default_factory=trio.Event)
    value: str | None = None
    error: str | None = None


async def file_identity(path: Path) -> tuple[str, int]:
    """(identity, size): the file as the system sees it now, "device:inode:size:mtime_ns". It keys a
    loaded capture (the same file by any path or link shares one worker) and costs one stat, where
    the content hash reads the whole file (seconds for a big capture)."""
    st = await trio.to_thread.run_sync(path.stat)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}", st.st_size


class Digests:
    """The sha256 of each capture file version the back end was asked about, hashed once: the pcap back
    end owns one (`PcapBackend.digests`) and hands it to its captures' sessions."""

    KEEP = 1024  # file versions remembered once hashed

    def __init__(self) -> None:
        self._digests: dict[str, _Digest] = {}

    def begin(self, path: Path, identity: str) -> None:
        """Start hashing this file version in the background (once), so that the answer's sha256 is ready
        by the time sharkd has read the file, instead of the load waiting for it."""
        digests = self._digests
        if identity in digests:
            return
        for old in [k for k, d in digests.items() if d.done.is_set()][:max(0, len(digests) - self.KEEP + 1)]:
            del digests[old]  # a bounded memory of versions hashed
        digest = digests[identity] = _Digest()

        async def compute() -> None:
            def read() -> str:
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
                return h.hexdigest()

            try:
                digest.value = await trio.to_thread.run_sync(read)
            except Exception as exc:  # a system task must not raise: the waiters get the error
                digest.error = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                digests.pop(identity, None)  # the next call tries again
            finally:
                digest.done.set()

        trio.lowlevel.spawn_system_task(compute)

    def if_ready(self, identity: str) -> str | None:
        """The file version's sha256 if hashed already (None: not yet, or it failed)."""
        digest = self._digests.get(identity)
        return digest.value if digest is not None and digest.done.is_set() else None

    async def sha256(self, path: Path, identity: str | None = None) -> tuple[str, int]:
        """sha256 of the file, cached per version (device, inode, size, mtime): hashed once."""
        if identity is None:
            identity, _ = await file_identity(path)
        self.begin(path, identity)
        digest = self._digests[identity]
        await digest.done.wait()
        if digest.error is not None:
            raise DiagdError(ErrorCode.FILE_NOT_FOUND, f"cannot read {path}: {digest.error}", path=str(path))
        assert digest.value is not None
        return digest.value, int(identity.rsplit(":", 2)[1])


_DECODE_AS = re.compile(r"^\s*([a-z0-9_.\-]+)\s*==\s*([0-9]+(?:-[0-9]+)?)\s*,\s*([A-Za-z0-9_.\-]+)\s*$")


def parse_decode_as(rule: str, cat: Catalogue) -> tuple[str, str, str]:
    """'tcp.port==7777,http2' -> ('tcp.port', '7777', 'http2'), checked against Wireshark."""
    m = _DECODE_AS.match(rule)
    if not m:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"decode_as rule {rule!r} is not 'table==value,protocol'",
                         example="tcp.port==7777,http2")
    table, value, proto = m.group(1), m.group(2), m.group(3).lower()
    if table not in cat.fields:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"decode_as selector {table!r} is not a Wireshark field",
                         did_you_mean=cat.suggestions(table))
    if proto not in cat.protocols:
        close = [p for p in cat.protocols if p.startswith(proto[:3])][:8]
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"decode_as protocol {proto!r} is not a Wireshark protocol",
                         did_you_mean=close)
    return table, value, proto


def decode_as_entries(rules: Sequence[str], cat: Catalogue) -> list[str]:
    """The decode_as_entries lines of Wireshark's config for these rules (parse_decode_as checks each)."""
    entries = []
    for rule in rules:
        table, value, proto = parse_decode_as(rule, cat)
        entries.append(f"decode_as_entry: {table},{value},(none),{proto.upper()}")
    return entries


def write_sharkd_config(config_dir: Path, entries: Sequence[str]) -> None:
    """The Wireshark config a sharkd reads (WIRESHARK_CONFIG_DIR): these decode-as entries, and no name
    resolution, as `tshark -n` (the cold passes and every equivalent command): with it sharkd writes
    "f2:41:23:4c:99:3b (f2:41:23:4c:99:3b)" in Ethernet items and vendor names in the address columns,
    and its answers would not match tshark's."""
    (config_dir / "decode_as_entries").write_text("\n".join(entries) + "\n")
    (config_dir / "preferences").write_text(
        "nameres.mac_name: FALSE\nnameres.transport_name: FALSE\nnameres.network_name: FALSE\n")
