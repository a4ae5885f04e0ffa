"""docs/architecture.md against the tree: every file and name it gives exists, its map and lists hold every
back end (found by entry point, as the daemon finds them) and package, and its newcomer's walk-through
(add a tool, add a back end) names what is there.

A name in backticks is checked by its form: a path (`actors/base.py`, `tests/actors/<backend>/`: a template
is each back end in turn, as is the walk-through's `mine`), a dotted name (`diagd.actors.runtime.Runtime`,
`Runtime.call`, `recording.USES`: imported and looked up), a call (`register(runtime)`: a function of that
name), a table (`[daemon] extra_backends`, `[tool.setuptools]`); anything else (a key, a code, a command)
must occur in the code.
"""

from __future__ import annotations

import importlib
import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from diagd.actors.runtime import Runtime
from diagd.daemon import config as config_mod
from diagd.daemon import discovery
from tests import backends
from tests.backends import settings_types

TOP = Path(__file__).resolve().parent.parent
PAGE = TOP / "docs" / "architecture.md"
PACKAGES = {"daemon": "diagd.daemon", "actors": "diagd.actors", "protocol": "diagd.protocol",
            "tests": "tests"}  # folder -> the module it imports as
SOURCES = ("daemon", "actors", "protocol", "tests", "scripts", "bench")  # where code and names live
TEMPLATES = ("<backend>", "<name>", "mine")  # stand for each back end in turn
NOT_PATHS = {"tools/call"}  # an MCP method, not a file
# Code the page shows as a pattern to follow, with names of the reader's choosing.
EXAMPLES = {"async def h(backend, ctx, args) -> SomeReply", "tools: ToolSet[Backend] = ToolSet()"}


def page_text(text: str) -> str:
    """The page without its fenced blocks (the map is read on its own), lines joined (a span may wrap)."""
    return re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")


def spans(text: str) -> list[str]:
    return sorted(set(re.findall(r"`([^`]+)`", page_text(text))))


def instances(span: str) -> list[str]:
    """`span` for each back end when it holds a template, else itself."""
    if not any(t in span for t in TEMPLATES):
        return [span]
    out = []
    for name in backends.names():
        text = span.replace("<backend>", name).replace("<name>", name)
        out.append(re.sub(r"(?<![A-Za-z])mine(?![A-Za-z])", name, text))
    return out


@cache
def source_files() -> list[Path]:
    # Not this file: the names it makes up to test the check are nowhere else.
    return sorted(p for folder in SOURCES for p in (TOP / folder).rglob("*.py")
                  if "__pycache__" not in p.parts and p != Path(__file__).resolve())


@cache
def tree_names() -> set[str]:
    """Every file and folder name in the tree (its code, tests and docs)."""
    return {p.name for folder in (*SOURCES, "docs") for p in (TOP / folder).rglob("*") if "__pycache__" not in p.parts}


@cache
def source_text() -> str:
    files = [*source_files(), TOP / "pyproject.toml", *(TOP / "scripts").glob("*.sh")]
    return "\n".join(p.read_text(errors="replace") for p in files)


def module_of(path: Path) -> str:
    rel = path.relative_to(TOP).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGES[parts[0]], *parts[1:]])


def importable(path: Path) -> ModuleType | None:
    if path.relative_to(TOP).parts[0] not in PACKAGES:
        return None
    return importlib.import_module(module_of(path))


def has_path(obj: Any, names: list[str]) -> bool:
    for name in names:
        if not hasattr(obj, name) and name not in getattr(obj, "__annotations__", {}):
            return False
        obj = getattr(obj, name, None)
    return True


def defined(name: str) -> bool:
    """A function, class, method or attribute of that name somewhere in the code."""
    return re.search(rf"(?m)^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]", source_text()) is not None


def resolves(dotted: str) -> bool:
    """`diagd.x.y.Z`, `protocol.utc`, `Class.attr`, `module.attr` (a module of that name in the tree) or
    `instance.method` (`runtime.ask`: a method of that name is defined)."""
    if dotted == discovery.GROUP:  # the entry points' group, not a module
        return True
    if dotted.startswith("protocol."):
        dotted = "diagd." + dotted
    parts = dotted.split(".")
    if parts[0] == "diagd":
        for cut in range(len(parts), 0, -1):
            try:
                module = importlib.import_module(".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            return has_path(module, parts[cut:])
        return False
    if len(parts) == 1:
        return defined(parts[0])
    head, rest = parts[0], parts[1:]
    if head[0].isupper():
        owners = [p for p in source_files() if re.search(rf"(?m)^class {head}\b", p.read_text(errors="replace"))]
        return any((m := importable(p)) is not None and has_path(getattr(m, head), rest) for p in owners)
    modules = [m for p in source_files() if p.stem == head and (m := importable(p)) is not None]
    return any(has_path(m, rest) for m in modules) or defined(rest[-1])


def config_table_ok(span: str) -> bool:
    """`[pcap]`, `[daemon] extra_backends`, `[tool.setuptools]`; `[table] key` is the page's placeholder."""
    table, _, key = span[1:].partition("]")
    key = key.strip()
    if span == "[table] key":
        return True
    pyproject = tomllib.loads((TOP / "pyproject.toml").read_text())
    node: Any = pyproject
    for part in re.findall(r'"[^"]+"|[^.]+', table):
        node = node.get(part.strip('"'), None) if isinstance(node, dict) else None
    if isinstance(node, dict) and (not key or key in node):
        return True
    own = {"daemon": config_mod.DaemonConfig, "mcp": config_mod.McpConfig}
    tables = {**{name: types[0] for name, types in settings_types().items()}, **own}
    return table in tables and (not key or key in tables[table].__dataclass_fields__)


def path_ok(path: str) -> bool:
    """A path from the top (`actors/base.py`, `tests/e2e/`), or one file or folder named somewhere in the
    tree (`cli.py`, `server/`, `ngap/`)."""
    if (TOP / path).exists():
        return True
    name = path.rstrip("/")
    return "/" not in name and name in tree_names()


def problem(span: str) -> str | None:
    """Why `span` names nothing in the tree (None: it does)."""
    bare = re.sub(r"^(?:await |@)", "", span)
    entry = re.fullmatch(r'(\w+) = "diagd\.actors\.(\w+)"', span)
    if entry:  # an entry point line: each back end has one
        text = (TOP / "pyproject.toml").read_text()
        missing = [n for n in backends.names() if f'{n} = "diagd.actors.{n}"' not in text]
        return f"no entry point line for {missing}" if missing else None
    if span.startswith("["):
        return None if config_table_ok(span) else "no such table or setting"
    call = re.fullmatch(r"([A-Za-z_][\w.]*)\((.*)\)", bare)
    if call:
        return None if resolves(call.group(1)) else "no such function"
    if span in NOT_PATHS or span in EXAMPLES or span.startswith("$state/"):
        return None
    if ":" in span:  # a reference, `<back end>:<id>`
        return None if re.fullmatch(r"\w+:<id>", span) else "unknown form"
    if "/" in span or re.fullmatch(r"[\w.-]+\.(?:py|toml|md|sh)", span):
        return None if path_ok(span) else "no such file or folder"
    if re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+", span) and not span.endswith((".sock", ".md")):
        return None if resolves(span) else "no such module, class or attribute"
    if re.fullmatch(r"[A-Za-z_]\w*", span) and (span[0].isupper() or "_" in span.strip("_")):
        return None if resolves(span) or re.search(rf"\b{re.escape(span)}\b", source_text()) else "not in the code"
    return None if span in source_text() else "not in the code"


def problems(text: str) -> Iterator[str]:
    for span in spans(text):
        for one in instances(span):
            why = problem(one)
            if why:
                yield f"`{one}`" + (f" (from `{span}`)" if one != span else "") + f": {why}"


def test_every_file_and_name_the_page_gives_is_in_the_tree() -> None:
    found = list(problems(PAGE.read_text()))
    assert not found, "docs/architecture.md names what is not there:\n" + "\n".join(found)


def test_the_check_finds_what_is_not_there() -> None:
    text = ("`actors/nosuch.py`, `tests/actors/<backend>/test_nothing.py`, `Runtime.nosuch`, `diagd.actors.nosuch`, "
            "`no_such_function()`, `[daemon] no_such_key`, `NO_SUCH_CODE`, `actors/runtime.py`, `Runtime.call`, "
            "`recording.USES`, `register(runtime)`, `[pcap]`")
    found = list(problems(text))
    assert len(found) == 6 + len(backends.names()), found
    assert not any(word in "".join(found) for word in ("actors/runtime.py", "Runtime.call", "USES", "[pcap]"))


def section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n{title}\n")
    level = title.split(" ")[0]
    end = re.search(rf"\n#{{1,{len(level)}}} ", text[start + len(title) + 2:])
    return text[start:start + len(title) + 2 + end.start()] if end else text[start:]


def test_the_map_holds_every_back_end_and_package() -> None:
    packages = section("## The packages")
    drawing = re.search(r"```\n(.*?)```", packages, re.S)
    assert drawing, "the packages section draws the map"
    missing = [f"actors/{name}" for name in backends.names() if f"actors/{name}" not in drawing.group(1)]
    subpackages = [f"diagd.daemon.{p.name}" for p in sorted((TOP / "daemon").iterdir()) if (p / "__init__.py").exists()]
    missing += [name for name in ("diagd.daemon", "diagd.actors", "diagd.protocol", *subpackages)
                if name not in drawing.group(1)]
    assert not missing, f"the map lacks {missing}"
    layout = section("## Layout")
    folders = set(re.findall(r"(?m)^\| `(\w+)/` \|", layout))
    installed = {folder for folder in tomllib.loads((TOP / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"].values() if folder != "diagd"}
    assert installed <= folders and {"tests", "bench"} <= folders, folders
    for name in backends.names():
        assert f"`{name}/`" in layout, f"the layout's actors/ row lacks {name}/"


def test_every_back_end_has_the_surface_and_the_helpers_the_page_gives() -> None:
    adding = section("## Adding a back end")
    surface = re.findall(r"(?m)^\| `(\w+\.py)` \| (.*) \|$", adding)
    assert len(surface) >= 8, surface
    helpers = dict(re.findall(r"(?m)^- \*\*([a-z]\w*)\*\*: (.*)$", adding))
    assert set(helpers) == set(backends.names()), f"its own helpers, listed per back end: {sorted(helpers)}"
    missing = []
    for name in backends.names():
        package = TOP / "actors" / name
        missing += [f"actors/{name}/{module}" for module, holds in surface
                    if not (package / module).exists() and " when " not in holds]  # "when its records have times"
        missing += [f"actors/{name}/{file}" for file in re.findall(r"`([\w/]+(?:\.py|/))`", helpers[name])
                    if not (package / file).exists()]
    assert not missing, f"the page gives modules that are not there: {missing}"


def test_every_runtime_method_is_on_the_page_and_its_table_names_only_real_ones() -> None:
    members = {n for n in dir(Runtime) if not n.startswith("_")} | set(Runtime.__annotations__)
    named = {m.group(1) for s in spans(PAGE.read_text()) if (m := re.match(r"(?:await )?(\w+)", s))}
    assert members <= named, f"Runtime's {sorted(members - named)} are not on the page"
    table = section("## Adding a back end").split("| `Runtime` | |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"(?m)^\| (.*?) \| .* \|$", table)
    first = [s for row in rows for s in re.findall(r"`([^`]+)`", row)]
    listed = {m.group(1) for s in first if (m := re.match(r"(?:await )?(\w+)", s))}
    assert len(listed) >= 15 and listed <= members, f"the Runtime table names {sorted(listed - members)}"


def test_the_walk_through_names_the_steps_and_pyproject_holds_every_back_end() -> None:
    for title in ("### Add a tool", "### Add a back end"):
        steps = re.findall(r"(?m)^\d+\. ", section(title))
        assert len(steps) >= 4, f"{title}: numbered steps"
    pyproject = tomllib.loads((TOP / "pyproject.toml").read_text())
    modules = {f"diagd.actors.{name}" for name in backends.names()}
    assert modules <= set(pyproject["tool"]["setuptools"]["packages"])
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    independent = next(c for c in contracts if c["type"] == "independence")
    assert set(independent["modules"]) == modules, "the independence contract lists every back end"
