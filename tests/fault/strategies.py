"""Hypothesis strategies for tool arguments: generated from each tool's input schema (as the daemon
lists it), steered towards real inputs where a back end only goes deep with them, and mutated into
out-of-schema junk.

The schemas use a small JSON Schema subset (object/properties/required/additionalProperties, string
with min/maxLength and pattern, integer/number with bounds, boolean, array with items and
min/maxItems, enum, anyOf, a list of types); `from_schema` covers exactly that and fails loudly on
anything else, so a tool with a new keyword is noticed here rather than fuzzed half-blind.
(hypothesis-jsonschema 0.23 does not run with hypothesis 6.170, and our own strategies keep sizes
and real inputs under control.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

KNOWN_KEYWORDS = {"type", "properties", "required", "additionalProperties", "minLength", "maxLength", "pattern",
                  "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "items", "minItems", "maxItems",
                  "enum", "anyOf", "default", "description", "title"}

# Strings stay short by default: long ones come from the junk mutations, on purpose and bounded.
MAX_TEXT = 40
MAX_ITEMS = 6
HUGE_TEXT = 100_000

# Paths an attacker would try; every back end taking a path must refuse or fail them with a code.
HOSTILE_PATHS = ["/etc/shadow", "../../../../etc/shadow", "../../etc/passwd", "/proc/self/environ", "/proc/self/mem",
                 "/dev/null", "/", "", ".", "~root/.ssh/id_rsa", "/etc/shadow\x00.pcap", "file:///etc/shadow",
                 "/tmp/../etc/shadow", "a" * 5000]


def text(*, min_size: int = 0, max_size: int = MAX_TEXT, json_wire: bool) -> st.SearchStrategy[str]:
    """Any text: NULs and control characters included. `json_wire`: the value travels as JSON (MCP), which
    can carry lone surrogates as escapes; msgpack (the control socket) needs valid UTF-8."""
    alphabet = st.characters() if json_wire else st.characters(exclude_categories=["Cs"])
    return st.text(alphabet=alphabet, min_size=min_size, max_size=max_size)


def from_schema(schema: dict[str, Any], *, json_wire: bool) -> st.SearchStrategy[Any]:
    unknown = set(schema) - KNOWN_KEYWORDS
    if unknown:
        raise ValueError(f"schema keywords the fuzzer does not know: {sorted(unknown)} in {schema}")
    if not schema:  # {} accepts any JSON value (the handler checks it): any value, small
        return junk_value(json_wire=json_wire, huge=False)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([from_schema(s, json_wire=json_wire) for s in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, json_wire=json_wire) for k in kind])
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        low = schema.get("minLength", 0)
        high = min(schema.get("maxLength", MAX_TEXT), max(low, MAX_TEXT))
        return text(min_size=low, max_size=high, json_wire=json_wire)
    if kind == "integer":
        low = schema.get("minimum")
        if "exclusiveMinimum" in schema:
            low = math.floor(schema["exclusiveMinimum"]) + 1
        high = schema.get("maximum")
        if not json_wire:  # msgpack carries 64-bit integers at most
            low = max(low, -(2**63)) if low is not None else -(2**63)
            high = min(high, 2**64 - 1) if high is not None else 2**64 - 1
        return st.integers(min_value=low, max_value=high)
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        floats = st.floats(min_value=low, max_value=schema.get("maximum"), allow_nan=False, allow_infinity=False,
                           exclude_min="exclusiveMinimum" in schema)
        int_low = None if low is None else (math.floor(low) + 1 if "exclusiveMinimum" in schema else math.ceil(low))
        high = schema.get("maximum")
        int_high = None if high is None else math.floor(high)
        if not json_wire:
            int_low = max(int_low, -(2**63)) if int_low is not None else -(2**63)
            int_high = min(int_high, 2**64 - 1) if int_high is not None else 2**64 - 1
        ints = st.integers(min_value=int_low, max_value=int_high)
        return floats | ints
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        items = from_schema(schema.get("items", {"type": "string"}), json_wire=json_wire)
        low = schema.get("minItems", 0)
        return st.lists(items, min_size=low, max_size=min(schema.get("maxItems", MAX_ITEMS), max(low, MAX_ITEMS)))
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: from_schema(v, json_wire=json_wire) for k, v in props.items() if k in required},
            optional={k: from_schema(v, json_wire=json_wire) for k, v in props.items() if k not in required})
    raise ValueError(f"schema the fuzzer cannot generate: {schema}")


# ---------------------------------------------------------------------------------------------
# Real inputs


@dataclass
class RealInputs:
    """Values that make a back end do real work; each property name maps to a strategy.

    `by_tool` overrides `by_name` for one tool (e.g. close_vmcore_session must never be handed the
    shared session: fuzzing it would end the session every other crash example uses).
    """

    by_name: dict[str, st.SearchStrategy[Any]] = field(default_factory=dict)
    by_tool: dict[tuple[str, str], st.SearchStrategy[Any]] = field(default_factory=dict)
    # Properties whose schema range would make one example slow (a 120 s wait) or start something
    # big: these replace the generated values instead of joining them.
    bounded: dict[str, st.SearchStrategy[Any]] = field(default_factory=dict)
    # One concrete, working value per property name: the required arguments of the deterministic sweeps.
    plain: dict[str, Any] = field(default_factory=dict)

    def lookup(self, tool: str, name: str) -> st.SearchStrategy[Any] | None:
        return self.by_tool.get((tool, name), self.by_name.get(name))


def tool_arguments(tool: str, schema: dict[str, Any], real: RealInputs, *,
                   json_wire: bool) -> st.SearchStrategy[dict[str, Any]]:
    """In-schema arguments (real inputs mixed in where given), or the same mutated into junk."""
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))

    def prop(name: str, sub: dict[str, Any]) -> st.SearchStrategy[Any]:
        if name in real.bounded:
            return real.bounded[name]
        generated = from_schema(sub, json_wire=json_wire)
        steered = real.lookup(tool, name)
        return generated if steered is None else st.one_of(steered, steered, generated)

    in_schema = st.fixed_dictionaries({k: prop(k, v) for k, v in props.items() if k in required},
                                      optional={k: prop(k, v) for k, v in props.items() if k not in required})
    return st.one_of(in_schema, in_schema.flatmap(lambda args: mutated(args, props, json_wire=json_wire)))


def junk_value(*, json_wire: bool, huge: bool = True) -> st.SearchStrategy[Any]:
    """Values no schema asks for: wrong types, extreme numbers, NULs, hostile paths, deep nesting."""
    scalars: list[st.SearchStrategy[Any]] = [
        st.none(), st.booleans(),
        st.sampled_from([-1, 0, -(2**63), 2**63 - 1, 2**31, -(2**31) - 1, 10**15]),
        st.sampled_from([-1.5, 1e308, -1e308, 5e-324]),
        # JSON has no NaN/Infinity (a line carrying them is a parse error, answered with id null) and
        # msgpack no integers beyond 64 bits: each wire gets the extremes it can carry.
        st.sampled_from([10**30, -(10**30)] if json_wire else [float("nan"), float("inf"), float("-inf")]),
        text(json_wire=json_wire), st.sampled_from(HOSTILE_PATHS),
        st.sampled_from(["\x00", "a\x00b", "\x00" * 64, "\u202e\ufeff", "%s%n%x", "$(id)", "`id`", "'; id #",
                         "\r\nOK\r\n", "\\", chr(0xDCFF) if json_wire else "\ufffd"]),
        st.binary(max_size=16).map(lambda b: b.decode("latin-1")),
    ]
    if huge:
        scalars.append(st.sampled_from([HUGE_TEXT, HUGE_TEXT // 10]).map(lambda n: "A" * n))
    leaf = st.one_of(scalars)
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        text(max_size=8, json_wire=json_wire), inner, max_size=3), max_leaves=8)


def mutated(args: dict[str, Any], props: dict[str, Any], *, json_wire: bool) -> st.SearchStrategy[dict[str, Any]]:
    """One of: a property with a junk value, an unknown key, a dropped required key, NULs in a string."""
    names = sorted(props)
    choices: list[st.SearchStrategy[dict[str, Any]]] = [
        st.tuples(text(min_size=1, max_size=12, json_wire=json_wire).filter(lambda k: k not in props),
                  junk_value(json_wire=json_wire, huge=False)).map(lambda kv: {**args, kv[0]: kv[1]}),
    ]
    if names:
        choices.append(st.tuples(st.sampled_from(names), junk_value(json_wire=json_wire))
                       .map(lambda kv: {**args, kv[0]: kv[1]}))
    if args:
        keys = sorted(args)
        choices.append(st.sampled_from(keys).map(lambda k: {n: v for n, v in args.items() if n != k}))
        strings = [k for k in keys if isinstance(args[k], str)]
        if strings:
            choices.append(st.tuples(st.sampled_from(strings), st.sampled_from(["\x00", "\x00\x00id", "\n\x00\r"]))
                           .map(lambda kv: {**args, kv[0]: args[kv[0]] + kv[1]}))
    return st.one_of(choices)

