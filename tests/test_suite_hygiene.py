"""The suite checks itself: no hollow assertions, no wall-clock bounds (timings belong in bench/).

An assertion that accepts every value (`x in (True, False)`) proves nothing, and a bound on a clock
read in a test (`perf_counter() - t0 < 2`) fails on a loaded machine and passes on a broken one
that happens to be fast. Both are found here by reading the tests' syntax trees. ALLOWED lists the
few clock reads that are not speed bounds, each with why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {("time", "time"), ("time", "perf_counter"), ("time", "monotonic"), ("time", "perf_counter_ns"),
          ("time", "monotonic_ns"), ("time", "time_ns")}

# "path::function" -> why its clock reads in assertions are not a speed bound.
ALLOWED: dict[str, str] = {
    "e2e/test_timeline.py::test_bpftrace_lines_carry_their_arrival_times":
        "the wall clock brackets the times diagd stamps on lines (correctness of a timestamp, not speed)",
}


def _is_clock_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in CLOCKS)


def _all_values(node: ast.AST) -> bool:
    """A container literal holding exactly both booleans (or None and both): membership in it is no check."""
    if not isinstance(node, ast.Tuple | ast.List | ast.Set):
        return False
    values = [elt.value for elt in node.elts if isinstance(elt, ast.Constant) and isinstance(elt.value, bool)]
    return {True, False} <= set(values)


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def problems_in(path: Path) -> Iterator[str]:
    rel = path.relative_to(TESTS).as_posix()
    tree = ast.parse(path.read_text())
    for function in _functions(tree):
        clock_names = {target.id for node in ast.walk(function) if isinstance(node, ast.Assign)
                       and _is_clock_call(node.value) for target in node.targets if isinstance(target, ast.Name)}
        for node in ast.walk(function):
            if not isinstance(node, ast.Assert):
                continue
            for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                if any(isinstance(op, ast.In | ast.NotIn) for op in compare.ops) and any(
                        _all_values(c) for c in compare.comparators):
                    yield f"{rel}:{node.lineno} {function.name}: membership in both booleans asserts nothing"
                if any(isinstance(n, ast.Name) and "deadline" in n.id for n in ast.walk(compare)):
                    continue  # a wait for a condition, bounded by a deadline: the way to wait
                reads_clock = any(_is_clock_call(n) or (isinstance(n, ast.Name) and n.id in clock_names)
                                  for n in ast.walk(compare))
                if reads_clock and f"{rel}::{function.name}" not in ALLOWED:
                    yield (f"{rel}:{node.lineno} {function.name}: an assertion on a wall-clock read "
                           "(measure speed in bench/, wait with events and deadlines)")


def test_no_hollow_assertion_and_no_wall_clock_bound_in_the_tests() -> None:
    found = list(dict.fromkeys(p for path in sorted(TESTS.rglob("*.py")) for p in problems_in(path)))
    assert not found, "\n".join(found)


def test_the_checker_finds_both_kinds(tmp_path: Path) -> None:
    sample = TESTS / "_hygiene_sample_test.py"
    sample.write_text("import time\n\ndef test_a():\n    t0 = time.perf_counter()\n"
                      "    assert time.perf_counter() - t0 < 2\n    assert f() in (True, False)\n"
                      "    deadline = time.monotonic() + 5\n    assert time.monotonic() < deadline\n"
                      "    assert g() in (0, 1)\n")
    try:
        found = list(problems_in(sample))
    finally:
        sample.unlink()
    assert len(found) == 2 and "wall-clock" in found[0] and "both booleans" in found[1]


def test_every_allowed_entry_names_a_function_that_still_reads_a_clock() -> None:
    for name in ALLOWED:
        rel, _, function = name.partition("::")
        tree = ast.parse((TESTS / rel).read_text())
        assert any(f.name == function and any(_is_clock_call(n) for n in ast.walk(f)) for f in _functions(tree)), name
