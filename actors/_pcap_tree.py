"""sharkd protocol trees: raw field values, text rendering cut to protocol subtrees, hex dumps.

A sharkd `frame` answer is a tree of nodes `{l: label, f: "field == value", t: "proto", n: [...]}`.
The `f` attribute carries the raw value exactly as a display filter would (`0x44`, `7`,
`"imsi-001..."`), which is what `tshark -T fields` prints, while custom columns would give the
resolved names ("Registration reject"). So values come from `f`, labels from `l`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
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


def render(nodes: Iterable[Node], indent: int = 0) -> str:
    """tshark -V style text: one label per line, four spaces per level."""
    lines = []
    for node, depth in walk(nodes):
        label = node.get("l")
        if label is not None:
            lines.append("    " * (indent + depth) + label)
    return "\n".join(lines)


def hexdump(data_b64: str) -> str:
    data = base64.b64decode(data_b64)
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset:offset + 16]
        hexpart = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:04x}  {hexpart:<47}  {text}")
    return "\n".join(lines)


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
