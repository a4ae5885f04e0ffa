"""No import cycle within diagd.actors.pcap, `TYPE_CHECKING` imports and imports inside functions included:
the actor imports the session and the answer builders, never the other way round (issue 23)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "diagd.actors.pcap"
ROOT = Path(__file__).resolve().parents[3] / "actors" / "pcap"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (any import statement anywhere in it)."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module:
                if node.module in modules:
                    found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
        # A package's own __init__ is imported with any of its modules: it does not make a cycle of them.
        graph[name] = {m for m in found if m != name and not name.startswith(f"{m}.")}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_pcap_package_has_no_import_cycle() -> None:
    graph = imports()
    assert f"{PACKAGE}.actor" in graph and f"{PACKAGE}.engine.session" in graph["diagd.actors.pcap.actor"]
    found = cycle({k: v for k, v in graph.items() if k != PACKAGE})  # __init__ re-exports register
    assert found is None, " -> ".join(found or [])


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
