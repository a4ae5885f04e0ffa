"""No import cycle among diagd's modules, imports under `if TYPE_CHECKING:` and inside functions included.

import-linter's contracts (pyproject.toml) hold layers and independence between packages, but not
cycles inside one (its graph leaves out nothing, yet no contract type forbids a cycle among a
package's own modules at any depth). This builds the graph with `ast` over daemon/, actors/ and
protocol/ and fails on every strongly connected group of modules, unless ALLOWED lists that exact
group with why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
PACKAGES = {"daemon": "diagd.daemon", "actors": "diagd.actors", "protocol": "diagd.protocol"}

# A cycle (its modules, sorted) -> why it may stay for now. Remove an entry once its cycle is gone.
ALLOWED: dict[tuple[str, ...], str] = {
}


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((TOP / folder).rglob("*.py")):
            parts = path.relative_to(TOP / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The diagd modules `name` imports, anywhere in its file (a `from package import module` names the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import diagd.actors.pcap.tools as t` -> the deepest known
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imported(name, path, known)) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(tuple(sorted(group)))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_import_cycle_among_diagd_modules_type_checking_imports_included() -> None:
    found = cycles(graph())
    new = [c for c in found if c not in ALLOWED]
    gone = [c for c in ALLOWED if c not in found]
    assert not new, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in new)
    assert not gone, "cycles listed in ALLOWED are gone (remove them):\n" + "\n".join(" ".join(c) for c in gone)


def test_the_cycle_finder_sees_a_type_checking_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b", "c")]
    assert cycles({"a": {"b"}, "b": set()}) == []
    # Imports under `if TYPE_CHECKING:` and inside functions count: both are edges of the graph.
    edges = graph()
    assert "diagd.actors.runtime" in edges["diagd.daemon.server.backends"]
