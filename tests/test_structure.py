"""Modules are sized by cohesion: each names its one job in its docstring's first line, and generous
caps (600 lines a module, 80 a function, in daemon/, actors/ and protocol/) catch what outgrew it.

The caps are a backstop, not the rule that decides where code lives: split a module when it does two
jobs, not to get under a number (squeezing blank lines to fit is the failure this avoids).
ALLOWED lists what may be over, with its length and why: an entry may not grow and must leave once
within the limit.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
FOLDERS = ("daemon", "actors", "protocol")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# "path" (a module) or "path::qualified.function" -> its length when it was listed (with why, in a comment).
ALLOWED: dict[str, int] = {
}


def measured() -> Iterator[tuple[str, int, int]]:
    """(name, length, limit) of every module and function in the checked folders."""
    for folder in FOLDERS:
        for path in sorted((TOP / folder).rglob("*.py")):
            rel = path.relative_to(TOP).as_posix()
            text = path.read_text()
            yield rel, len(text.splitlines()), MAX_MODULE_LINES
            for qualname, length in _functions(ast.parse(text)):
                yield f"{rel}::{qualname}", length, MAX_FUNCTION_LINES


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            yield name, (node.end_lineno or node.lineno) - node.lineno + 1
            yield from _functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def test_no_module_or_function_is_over_its_limit_unless_listed_and_none_grows() -> None:
    sizes: dict[str, tuple[int, int]] = {}
    for name, length, limit in measured():
        if name not in sizes or length > sizes[name][0]:  # a name defined twice counts by its longest
            sizes[name] = (length, limit)
    problems = []
    for name, (length, limit) in sorted(sizes.items()):
        allowed = ALLOWED.get(name)
        if length > limit and allowed is None:
            problems.append(f"{name}: {length} lines, over the limit of {limit}")
        elif allowed is not None and length > allowed:
            problems.append(f"{name}: grew to {length} lines (allowed {allowed} while it waits to be split)")
        elif allowed is not None and length <= limit:
            problems.append(f"{name}: {length} lines, within the limit now: remove it from ALLOWED")
    problems += [f"{name}: listed in ALLOWED but gone: remove it" for name in sorted(set(ALLOWED) - set(sizes))]
    assert not problems, "\n".join(problems)


def test_every_module_names_its_one_job_in_its_first_docstring_line() -> None:
    missing = []
    for folder in FOLDERS:
        for path in sorted((TOP / folder).rglob("*.py")):
            rel = path.relative_to(TOP).as_posix()
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            first = doc.strip().splitlines()[0] if doc.strip() else ""
            if path.name == "__init__.py" and not path.read_text().strip():
                continue  # an empty package marker has no job of its own
            if len(first.split()) < 3:
                missing.append(f"{rel}: first docstring line {first!r} does not name the module's job")
    assert not missing, "\n".join(missing)
