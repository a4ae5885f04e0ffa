"""sharkd protocol trees: raw field values, text rendering cut to protocol subtrees, hex dumps.

A sharkd `frame` answer is a tree of nodes `{l: label, f: "field == value", t: "proto", n: [...]}`.
The `f` attribute carries the raw value exactly as a display filter would (`0x44`, `7`,
`"imsi-001..."`), which is what `tshark -T fields` prints, while custom columns would give the
resolved names ("Registration reject"). So values come from `f`, labels from `l`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

Node = dict[str, Any]


def walk(nodes: Iterable[Node], depth: int = 0) -> Iterator[tuple[Node, int]]:
    for node in nodes:
        yield node, depth
        children = node.get("n")
        if children:
            yield from walk(children, depth + 1)


def parse_f(f: str) -> tuple[str, str | None]:
    """'ngap.RAN_UE_NGAP_ID == 2' -> ('ngap.RAN_UE_NGAP_ID', '2'); 'ngap' -> ('ngap', None)."""
    name, sep, value = f.partition(" == ")
    if not sep:
        return f, None
    if value.startswith('"') and value.endswith('"') and len(value) >= 2:
        try:
            return name, str(json.loads(value))
        except ValueError:
            return name, value[1:-1]
    return name, value


def field_values(tree: list[Node], wanted: set[str] | None = None) -> dict[str, list[str]]:
    """Every occurrence of every (wanted) field, in tree order."""
    out: dict[str, list[str]] = {}
    for node, _ in walk(tree):
        f = node.get("f")
        if not f:
            continue
        name, value = parse_f(f)
        if value is None or (wanted is not None and name not in wanted):
            continue
        out.setdefault(name, []).append(value)
    return out


def protocol_nodes(tree: list[Node], names: set[str]) -> list[Node]:
    """Outermost protocol subtrees whose filter name is in `names` (nested ones included once)."""
    found: list[Node] = []

    def visit(nodes: list[Node]) -> None:
        for node in nodes:
            if node.get("t") == "proto" and node.get("f") in names:
                found.append(node)
                continue
            if node.get("n"):
                visit(node["n"])

    visit(tree)
    return found


def render(nodes: Iterable[Node], indent: int = 0, sources: Sequence[bytes] | None = None) -> str:
    """`tshark -V` text: one label per line, four spaces per level, generated items in brackets.

    With `sources` (the frame's data sources, primary first) every `data` protocol item is
    followed by a blank line and the hex dump of its bytes, as tshark -V prints uninterpreted
    data; `tshark -V -x` prints no such dumps (the whole frame follows), so callers omit them.
    """
    lines = []
    for node, depth in walk(nodes):
        label = node.get("l")
        if label is None:
            continue
        lines.append("    " * (indent + depth) + (f"[{label}]" if node.get("g") else str(label)))
        if sources is not None and node.get("t") == "proto" and node.get("f") == "data":
            chunk = node_bytes(node, sources)
            if chunk:
                lines.append("")
                lines.extend(hex_lines(chunk))
    return "\n".join(lines)


def node_bytes(node: Node, sources: Sequence[bytes]) -> bytes:
    """The bytes an item covers: `h` is [start, length] in data source `ds` (0: the frame itself)."""
    where = node.get("h")
    index = int(node.get("ds", 0))
    if not where or not 0 <= index < len(sources):
        return b""
    start, length = int(where[0]), int(where[1])
    return sources[index][start:start + length]


def frame_sources(answer: dict[str, Any]) -> list[bytes]:
    """The data sources of a sharkd `frame` answer asked with bytes: the frame, then each extra
    source (reassembled, decompressed...) in the order its `ds` index counts them."""
    sources = [base64.b64decode(answer.get("bytes") or "")]
    sources.extend(base64.b64decode(ds.get("bytes") or "") for ds in answer.get("ds") or [])
    return sources


def source_names(answer: dict[str, Any]) -> list[str]:
    first = f"Frame ({len(base64.b64decode(answer.get('bytes') or ''))} bytes)"
    return [first, *(str(ds.get("name", "")) for ds in answer.get("ds") or [])]


HEX_CELLS_WIDTH = 47  # 16 cells of "xx" joined by spaces
HEX_TEXT_GAP = "   "  # between the hex cells and the text column


def hex_line(offset: str, cells: str, text: str) -> str:
    """One hex-dump line laid out as tshark prints it (the mask rewrites lines in this layout)."""
    return f"{offset}  {cells:<{HEX_CELLS_WIDTH}}{HEX_TEXT_GAP}{text}"


def hex_lines(data: bytes) -> list[str]:
    """tshark's hex dump (epan/print.c print_hex_data_buffer): 16 bytes a line, hex column padded
    to 47 characters, three spaces, printable ASCII; the offset grows past 4 digits only when the
    buffer needs it."""
    digits = max(4, len(f"{len(data) - 1:x}")) if data else 4
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset:offset + 16]
        hexpart = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(hex_line(f"{offset:0{digits}x}", hexpart, text))
    return lines


def hexdump(data_b64: str) -> str:
    return "\n".join(hex_lines(base64.b64decode(data_b64)))


def frame_hexdump(answer: dict[str, Any]) -> str:
    """What `tshark -x` prints for a frame: every data source, named when there are several."""
    sources = frame_sources(answer)
    names = source_names(answer)
    lines: list[str] = []
    for name, data in zip(names, sources, strict=True):
        if len(sources) > 1:
            lines.append(f"{name}:")
        lines.extend(hex_lines(data))
    return "\n".join(lines)


def layer_names(tree: list[Node]) -> list[str]:
    """Filter names of every protocol in the frame, nested ones included, in tree order."""
    return list(dict.fromkeys(str(n.get("f")) for n, _ in walk(tree) if n.get("t") == "proto" and n.get("f")))


DELTA_DISPLAYED = "frame.time_delta_displayed"


def epoch_ns(tree: list[Node]) -> int | None:
    """The frame's arrival time in integer nanoseconds (from frame.time_epoch, never a float)."""
    for node, _ in walk(tree):
        name, value = parse_f(str(node.get("f", "")))
        if name == "frame.time_epoch" and value is not None:
            return seconds_to_ns(value)
    return None


def seconds_to_ns(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    whole, _, frac = text.lstrip("+-").partition(".")
    return sign * (int(whole or "0") * 10**9 + int((frac + "000000000")[:9]))


def ns_to_seconds(ns: int) -> str:
    sign = "-" if ns < 0 else ""
    return f"{sign}{abs(ns) // 10**9}.{abs(ns) % 10**9:09d}"


COLORING = frozenset({"frame.coloring_rule.name", "frame.coloring_rule.string"})


def displayed(tree: list[Node], previous_ns: int | None) -> list[Node]:
    """The frame's tree as `tshark -Y` shows it when the frame displayed before it arrived at
    `previous_ns` (None: it is the first one displayed)."""
    now = epoch_ns(tree)
    delta = now - previous_ns if now is not None and previous_ns is not None else 0
    return with_displayed_delta(tree, delta)


def with_displayed_delta(tree: list[Node], delta_ns: int) -> list[Node]:
    """The tree with "Time delta from previous displayed frame" set to `delta_ns`, as tshark -V prints it.

    sharkd dissects every frame as if all frames were displayed (its `prev_frame` parameter is
    unusable in 4.0), while tshark -Y counts only the frames the filter displays; the callers
    know which frames are displayed and set the value tshark would print. The frame's
    "[Coloring Rule Name/String]" items go: sharkd colourises frames (a GUI's list colours) and
    tshark does not, so they are no part of the packet and tshark -V never prints them. Nodes are
    copied, the cached tree is left alone.
    """
    seconds = ns_to_seconds(delta_ns)

    def fix(nodes: list[Node]) -> list[Node]:
        out = []
        for node in nodes:
            name, _ = parse_f(str(node.get("f", "")))
            if name in COLORING:
                continue
            if name == DELTA_DISPLAYED:
                node = {**node, "f": f"{DELTA_DISPLAYED} == {seconds}",
                        "l": f"Time delta from previous displayed frame: {seconds} seconds"}
            elif node.get("f") == "frame" and node.get("n"):
                node = {**node, "n": fix(node["n"])}
            out.append(node)
        return out

    return fix(tree)


def top_protocols(tree: list[Node]) -> list[str]:
    return [str(n.get("f")) for n in tree if n.get("t") == "proto" and n.get("f")]


def labelled(nodes: Iterable[Node]) -> Iterator[tuple[str, str | None, str]]:
    """(field name, raw value or None, label) for every node with a filter name."""
    for node, _ in walk(nodes):
        f = node.get("f")
        if f:
            name, value = parse_f(f)
            yield name, value, str(node.get("l", ""))


def label_name(label: str) -> str:
    """'procedureCode: id-InitialUEMessage (15)' -> 'id-InitialUEMessage'."""
    _, _, rest = label.partition(": ")
    text = rest or label
    if text.endswith(")") and " (" in text:
        text = text[: text.rfind(" (")]
    return text.strip()
