"""No process-wide mutable state in actors/: every cache, lock and event belongs to an object its back end
owns and passes down (issue 44), so two daemons in one process, a reload or a test start from nothing.

Read from each module's syntax tree. What counts as state, at module level (statements of the module
body, also under a module-level `if`/`try`/`with`) or in a module-level class's body:

- a synchronisation or stateful object, always: trio/threading/asyncio locks, events, semaphores,
  conditions, capacity limiters, memory channels, queues; OrderedDict, defaultdict, deque, Counter,
  ChainMap, the weakref collections, itertools.count, bytearray: they exist to change;
- a function or method decorated with functools.cache / lru_cache (or a module-level name bound to
  one): a process-wide cache keyed on whatever it is called with;
- a name a function rebinds through `global`, whatever its value (a lazily set singleton or cache);
- a dict, list or set (display, comprehension or constructor call) that code in a function mutates:
  `NAME[k] = v`, `del NAME[k]`, `NAME[k] += 1`, a mutating method (`append`, `add`, `update`, `pop`,
  `clear`, `setdefault`, `move_to_end`, ...) on it or on what it holds (`NAME[k].append(x)`), heapq /
  bisect / random.shuffle on it; in its own module or in a module of actors/ that imports it.

A table filled while the module is imported (statements of the module body itself) and only read
afterwards is a constant, not state: that is what separates the many lookup tables from caches. (A
table handed to code that mutates it under another name is beyond a syntax check: keep tables tuples,
frozensets or MappingProxyType when they leave their module.)

Allowed on purpose: a `ContextVar` (the variable is a module-level key, but each Trio task reads and sets
its own context's value, copied when the task starts: nothing is shared between calls, nothing needs a
lock); a `trio.lowlevel.RunVar` (a value per Trio run: one daemon, one test, as trio's own thread limiter
is); tuples, frozensets, MappingProxyType, strings, numbers, compiled patterns, loggers, and objects
filled at import (a `ToolSet` its decorators fill: the registration ends with the import).

ALLOWED lists the state that is there today in modules other work is changing, with why it may stay for
now; an entry must leave once its state has moved (a stale entry fails too), and nothing new is added.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
FOLDERS = ("actors",)

# (module, name) -> why it may stay for now: state in modules other work is rewriting, or reached only through
# a free function those modules call (its state can move only with the call). Everything else has moved into
# an object its back end owns (PcapBackend.digests, PcapBackend.wireshark, Catalogue.tcp_decodes,
# CaptureBackend.recording_stops, ToolSpec.output_schema).
ALLOWED: dict[tuple[str, str], str] = {}

# Calls that make an object whose job is to change (fully qualified, after the module's imports).
STATEFUL_CALLS = frozenset({
    *(f"trio.{name}" for name in ("Lock", "StrictFIFOLock", "Event", "Semaphore", "CapacityLimiter", "Condition",
                                  "open_memory_channel", "CancelScope")),
    *(f"threading.{name}" for name in ("Lock", "RLock", "Event", "Semaphore", "BoundedSemaphore", "Condition",
                                       "local", "Barrier")),
    *(f"asyncio.{name}" for name in ("Lock", "Event", "Semaphore", "BoundedSemaphore", "Condition", "Queue")),
    *(f"collections.{name}" for name in ("OrderedDict", "defaultdict", "deque", "Counter", "ChainMap")),
    *(f"typing.{name}" for name in ("OrderedDict", "DefaultDict", "Deque", "Counter", "ChainMap")),
    *(f"weakref.{name}" for name in ("WeakValueDictionary", "WeakKeyDictionary", "WeakSet")),
    *(f"queue.{name}" for name in ("Queue", "SimpleQueue", "LifoQueue", "PriorityQueue")),
    "itertools.count", "builtins.bytearray",
    "functools.cache", "functools.lru_cache",
})
CACHE_DECORATORS = frozenset({"functools.cache", "functools.lru_cache"})
CONTAINER_CALLS = frozenset({"builtins.dict", "builtins.list", "builtins.set"})
MUTATORS = frozenset({
    "append", "extend", "insert", "add", "update", "pop", "popitem", "clear", "setdefault", "move_to_end",
    "remove", "discard", "sort", "reverse", "appendleft", "popleft", "extendleft", "rotate",
    "difference_update", "intersection_update", "symmetric_difference_update", "__setitem__", "__delitem__",
})
MUTATING_FUNCTIONS = frozenset({"heapq.heappush", "heapq.heappop", "heapq.heapify", "heapq.heapreplace",
                                "heapq.heappushpop", "bisect.insort", "bisect.insort_left", "bisect.insort_right",
                                "random.shuffle"})


@dataclass(frozen=True)
class Found:
    module: str  # actors/x/y.py
    name: str  # the module-level name (Class.attr in a class body)
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.name}: {self.what}"


@dataclass
class Module:
    rel: str
    dotted: str  # diagd.actors.x.y
    tree: ast.Module
    imports: dict[str, str]  # local name -> what it names, fully qualified ("trio.Lock", "diagd.actors.x")
    containers: dict[str, int]  # module-level dict/list/set names (Class.attr in a class body) -> line


def _dotted(path: Path) -> str:
    rel = path.relative_to(TOP).with_suffix("")
    parts = ["diagd", *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, dotted: str, is_package: bool) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = dotted.split(".") if is_package else dotted.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join([*package, *([base] if base else [])])
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def _qualified(node: ast.expr, imports: dict[str, str]) -> str | None:
    """`trio.Lock` / `Lock` (from trio import Lock) -> "trio.Lock"; a builtin -> "builtins.<name>"."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    head = imports.get(node.id, f"builtins.{node.id}" if not parts else node.id)
    return ".".join([head, *reversed(parts)])


def _module_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import: the body, and what a module-level if/try/with/for holds."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.For | ast.While | ast.With):
            yield from _module_statements(stmt.body + getattr(stmt, "orelse", []))
        elif isinstance(stmt, ast.Try):
            yield from _module_statements(stmt.body + stmt.orelse + stmt.finalbody
                                          + [s for h in stmt.handlers for s in h.body])


def _assigned(stmt: ast.stmt) -> list[tuple[str, ast.expr]]:
    if isinstance(stmt, ast.Assign):
        return [(t.id, stmt.value) for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return [(stmt.target.id, stmt.value)]
    return []


def _is_container(value: ast.expr, imports: dict[str, str]) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    return isinstance(value, ast.Call) and _qualified(value.func, imports) in CONTAINER_CALLS


def _stateful_call(value: ast.expr, imports: dict[str, str]) -> str | None:
    """The stateful constructor `value` calls (also inside a call: `functools.lru_cache(8)(f)`), if any."""
    while isinstance(value, ast.Call):
        name = _qualified(value.func, imports)
        if name in STATEFUL_CALLS:
            return name
        value = value.func
    return None


def _decorated_cache(node: ast.FunctionDef | ast.AsyncFunctionDef, imports: dict[str, str]) -> str | None:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (name := _qualified(target, imports)) in CACHE_DECORATORS:
            return name
    return None


def _scopes(stmts: list[ast.stmt], prefix: str) -> Iterator[tuple[str, ast.stmt]]:
    """(name prefix, statement) of the module body and of its classes' bodies ("Class." prefix)."""
    for stmt in _module_statements(stmts):
        yield prefix, stmt
        if isinstance(stmt, ast.ClassDef):
            yield from _scopes(stmt.body, f"{prefix}{stmt.name}.")


def load(path: Path) -> Module:
    return parse(path.read_text(), path.relative_to(TOP).as_posix(), _dotted(path), path.name == "__init__.py")


def parse(text: str, rel: str, dotted: str, is_package: bool = False) -> Module:
    tree = ast.parse(text, filename=rel)
    imports = _imports(tree, dotted, is_package)
    containers = {f"{prefix}{name}": stmt.lineno for prefix, stmt in _scopes(tree.body, "")
                  for name, value in _assigned(stmt) if _is_container(value, imports)}
    return Module(rel, dotted, tree, imports, containers)


def declared_state(module: Module) -> Iterator[Found]:
    """Module-level (and class-level) names that are state by what they are, whatever code does with them."""
    for prefix, stmt in _scopes(module.tree.body, ""):
        for name, value in _assigned(stmt):
            if (made := _stateful_call(value, module.imports)) is not None:
                yield Found(module.rel, f"{prefix}{name}", stmt.lineno, f"{made}(...) at module level")
        if (isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
                and (cache := _decorated_cache(stmt, module.imports)) is not None):
            yield Found(module.rel, f"{prefix}{stmt.name}", stmt.lineno, f"@{cache}: a process-wide cache")


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield node


@dataclass(frozen=True)
class _Owner:
    """The module-level class a method belongs to: `cls.X` is its class attribute X, and so is `self.X`
    unless the class sets X on its instances (`self.X = ...`)."""

    name: str
    instance_attrs: frozenset[str]


def _owners(tree: ast.Module) -> dict[int, _Owner]:
    """id(function) -> its class, for every function inside a module-level class."""
    owners: dict[int, _Owner] = {}
    for _, stmt in _scopes(tree.body, ""):
        if isinstance(stmt, ast.ClassDef):
            attrs = frozenset(node.attr for node in ast.walk(stmt) if isinstance(node, ast.Attribute)
                              and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                              and node.value.id == "self")
            for node in ast.walk(stmt):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    owners.setdefault(id(node), _Owner(stmt.name, attrs))
    return owners


def _root(chain: ast.expr, module: Module, local_names: set[str], owner: _Owner | None) -> str | None:
    """The module-level name (or class attribute) a chain `X[k].y(...)[j]` starts from, fully qualified
    ("pkg.mod.X", "pkg.mod.Cls.attr"); None when it starts from a local of the function."""
    node = chain
    while True:
        if isinstance(node, ast.Subscript | ast.Starred):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name):
                base = node.value.id
                if owner is not None and base in ("cls", "self") and base in local_names:
                    if base == "self" and node.attr in owner.instance_attrs:
                        return None
                    return f"{module.dotted}.{owner.name}.{node.attr}"
                if base in local_names:
                    return None
                if base in module.imports:  # module.NAME
                    return f"{module.imports[base]}.{node.attr}"
                return f"{module.dotted}.{base}.{node.attr}"  # Cls.attr
            node = node.value
        elif isinstance(node, ast.Name):
            if node.id in local_names:
                return None
            return module.imports.get(node.id, f"{module.dotted}.{node.id}")
        else:
            return None


def mutations(module: Module) -> Iterator[tuple[str, int, str]]:
    """(qualified name, line, how) of every mutation, inside a function, of a chain a name starts."""
    owners = _owners(module.tree)
    for function in _functions(module.tree):
        local_names = _locals(function)
        owner = owners.get(id(function))

        def root(chain: ast.expr) -> str | None:
            return _root(chain, module, local_names, owner)  # noqa: B023  (called in this iteration only)

        for node in ast.walk(function):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = node.targets
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Subscript) and (name := root(part.value)) is not None:
                        yield name, node.lineno, "item assignment or deletion"
            if not isinstance(node, ast.Call):
                continue
            if (isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and (name := root(node.func.value)) is not None):
                yield name, node.lineno, f".{node.func.attr}()"
            if (node.args and (called := _qualified(node.func, module.imports)) in MUTATING_FUNCTIONS
                    and (name := root(node.args[0])) is not None):
                yield name, node.lineno, f"{called}()"


def _locals(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """Names bound in `function` (its parameters, assignments, loops, ...) that are not declared global."""
    args = function.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
    declared: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Global):
            declared.update(node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node is not function:
            names.add(node.name)
        elif isinstance(node, ast.arg) and node is not function:
            names.add(node.arg)
    return names - declared


def rebound_globals(module: Module) -> Iterator[Found]:
    defined = {name: stmt.lineno for stmt in _module_statements(module.tree.body) for name, _ in _assigned(stmt)}
    for function in _functions(module.tree):
        declared = {name for node in ast.walk(function) if isinstance(node, ast.Global) for name in node.names}
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del) and node.id in declared:
                yield Found(module.rel, node.id, defined.get(node.id, node.lineno),
                            f"rebound in a function through `global` (line {node.lineno})")


def modules() -> list[Module]:
    return [load(path) for folder in FOLDERS for path in sorted((TOP / folder).rglob("*.py"))
            if "__pycache__" not in path.parts]


@functools.cache
def found_in_tree() -> tuple[Found, ...]:
    return tuple(found_state(modules()))


def found_state(loaded: list[Module]) -> list[Found]:
    by_name = {f"{m.dotted}.{name}": (m, name) for m in loaded for name in m.containers}
    found: dict[tuple[str, str], Found] = {}
    for module in loaded:
        for item in [*declared_state(module), *rebound_globals(module)]:
            found.setdefault((item.module, item.name), item)
        for root, line, how in mutations(module):
            if root in by_name:
                owner, name = by_name[root]
                where = "" if owner is module else f" in {module.rel}"
                found.setdefault((owner.rel, name), Found(
                    owner.rel, name, owner.containers[name],
                    f"a module-level container mutated at run time ({how}, line {line}{where})"))
    return sorted(found.values(), key=lambda f: (f.module, f.line))


def test_no_new_module_level_mutable_state() -> None:
    found = found_in_tree()
    new = [str(f) for f in found if (f.module, f.name) not in ALLOWED]
    assert not new, ("process-wide mutable state: give it to an object the back end owns and passes down "
                     "(see this test's docstring):\n" + "\n".join(new))


def test_allowed_state_is_still_there() -> None:
    """An entry of ALLOWED whose state has moved must leave the list (it may not come back)."""
    found = {(f.module, f.name) for f in found_in_tree()}
    stale = [f"{module}: {name}" for module, name in ALLOWED if (module, name) not in found]
    assert not stale, "no longer state: remove from ALLOWED:\n" + "\n".join(stale)


STATEFUL = """
import functools, trio
from collections import OrderedDict
from trio import Event

_lock = trio.Lock()
_ready = Event()
_cache: OrderedDict[str, int] = OrderedDict()
_seen = {}
_queue = []
_nested = {"a": []}
_lazy = None
TABLE = {"a": 1}
FILLED = {}
FILLED["b"] = 2  # at import: construction, not state
NAMES = ["x", "y"]


@functools.lru_cache(maxsize=8)
def memo(x: str) -> str:
    return x


class Kind:
    registry = {}
    guard = trio.Semaphore(2)

    @classmethod
    def add(cls, name: str) -> None:
        cls.registry[name] = 1


def touch(key: str) -> int:
    global _lazy
    _lazy = key
    _seen[key] = 1
    _queue.append(key)
    _nested["a"].append(key)
    names = list(NAMES)
    names.append(key)  # a local copy: not the table
    return TABLE[key] + FILLED.get(key, 0)
"""

OTHER = """
from diagd.actors.x.mod import SHARED
from diagd.actors.x import mod


def grow(key: str) -> None:
    SHARED.add(key)
    mod.ALSO.setdefault(key, 0)
"""


def test_the_rule_finds_state_and_leaves_tables_and_import_time_fills_alone() -> None:
    mod = parse(STATEFUL + "SHARED = set()\nALSO = {}\n", "actors/x/mod.py", "diagd.actors.x.mod")
    other = parse(OTHER, "actors/x/other.py", "diagd.actors.x.other")
    found = {f.name: f.what for f in found_state([mod, other])}
    assert set(found) == {"_lock", "_ready", "_cache", "_seen", "_queue", "_nested", "_lazy", "memo",
                          "Kind.registry", "Kind.guard", "SHARED", "ALSO"}, found
    assert "in actors/x/other.py" in found["SHARED"] and "global" in found["_lazy"]
