"""Display filters the index answers: a Wireshark display filter on indexed fields, as a SQL condition
over the frames table, or None (the filter goes to sharkd or tshark, which read the capture).

Only what means the same in both is translated, as Wireshark 4.0 evaluates it:
- a protocol's name alone, of PROTOCOLS (`udp`, `ngap`, `nas-5gs`): the frame holds that layer
  (frame.protocols); `frame`: every frame;
- an indexed field alone (`ip.src`, `tcp.stream`): it occurs in the frame;
- `field OP value`, OP one of == != < > <= >= (or eq ne lt gt le ge), and `field in {v1, v2, ...}`,
  for the fields of FIELDS: a field of many occurrences matches when any occurrence does, except
  `!=`, which needs every occurrence to differ (Wireshark's "all not equal"); a comparison with a
  field the frame lacks is false, whatever `!` is put before it then;
- `ip.addr`/`ipv6.addr`/`tcp.port`/`udp.port`/`sctp.port`: source or destination, any occurrence;
- `&&` `and`, `||` `or`, `!` `not`, parentheses.

Values are checked here as Wireshark would read them: IPv4 and IPv6 addresses (written in any form,
compared in the one tshark prints), integers (decimal, 0x hex, 0 octal as in C). Anything else (a
hostname, a subnet, a string, a slice, a function, another field) is not translated.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

# Each field: the frames-table columns holding it (several: any of them), its kind, whether listed.
Kind = str  # "ipv4" | "ipv6" | "int"


@dataclass(frozen=True)
class Field:
    columns: tuple[str, ...]
    kind: Kind
    many: bool = True


FIELDS: dict[str, Field] = {
    "frame.number": Field(("number",), "int", many=False),
    "frame.len": Field(("length",), "int", many=False),
    "frame.cap_len": Field(("cap_len",), "int", many=False),
    "ip.src": Field(("ip_src",), "ipv4"), "ip.dst": Field(("ip_dst",), "ipv4"),
    "ip.addr": Field(("ip_src", "ip_dst"), "ipv4"),
    "ipv6.src": Field(("ipv6_src",), "ipv6"), "ipv6.dst": Field(("ipv6_dst",), "ipv6"),
    "ipv6.addr": Field(("ipv6_src", "ipv6_dst"), "ipv6"),
    "tcp.srcport": Field(("src_port",), "int"), "tcp.dstport": Field(("dst_port",), "int"),
    "tcp.port": Field(("src_port", "dst_port"), "int"), "tcp.stream": Field(("tcp_stream",), "int"),
    "udp.srcport": Field(("udp_src_port",), "int"), "udp.dstport": Field(("udp_dst_port",), "int"),
    "udp.port": Field(("udp_src_port", "udp_dst_port"), "int"), "udp.stream": Field(("udp_stream",), "int"),
    "sctp.srcport": Field(("sctp_src_port",), "int"), "sctp.dstport": Field(("sctp_dst_port",), "int"),
    "sctp.port": Field(("sctp_src_port", "sctp_dst_port"), "int"),
}
OPERATORS = {"==": "==", "eq": "==", "!=": "!=", "ne": "!=", "<": "<", "lt": "<", ">": ">", "gt": ">",
             "<=": "<=", "le": "<=", ">=": ">=", "ge": ">="}
# Protocols whose name alone matches exactly the frames naming them in frame.protocols (checked on every
# corpus capture against tshark -Y). Not every protocol does: a dissector may add a layer without its
# protocol item (`http` under HTTP/2, `gtp` under GTP-prime on some captures), so a name not listed here
# goes to sharkd.
PROTOCOLS = frozenset({"eth", "ip", "ipv6", "udp", "tcp", "sctp", "icmp", "icmpv6", "arp", "dns", "ngap",
                       "nas-5gs", "pfcp", "gtpv2", "s1ap", "diameter", "sip", "http2", "json", "data"})
MAX_LENGTH = 4096
_TOKEN = re.compile(r"\s*(&&|\|\||==|!=|<=|>=|[()!<>{},]|[A-Za-z0-9_.:\-]+)")


class Untranslated(Exception):
    """Not a filter the index answers as Wireshark would."""


def to_sql(display_filter: str) -> str | None:
    """The filter as a SQL condition on the frames table's columns (None: not one the index answers)."""
    if not display_filter.strip():
        return "TRUE"
    if len(display_filter) > MAX_LENGTH:
        return None
    try:
        tokens = _tokens(display_filter)
        parser = _Parser(tokens)
        sql = parser.expression()
        if parser.at < len(tokens):
            raise Untranslated(tokens[parser.at])
    except Untranslated:
        return None
    return sql


def _tokens(text: str) -> list[str]:
    tokens, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        m = _TOKEN.match(text, at)
        if m is None:
            raise Untranslated(text[at:])
        tokens.append(m.group(1))
        at = m.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.at = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise Untranslated("the filter ends early")
        self.at += 1
        return token

    def expression(self) -> str:
        self.depth += 1
        if self.depth > 100:
            raise Untranslated("nested too deep")
        terms = [self.conjunction()]
        while self.peek() in ("||", "or"):
            self.take()
            terms.append(self.conjunction())
        self.depth -= 1
        return terms[0] if len(terms) == 1 else "(" + " OR ".join(terms) + ")"

    def conjunction(self) -> str:
        terms = [self.negation()]
        while self.peek() in ("&&", "and"):
            self.take()
            terms.append(self.negation())
        return terms[0] if len(terms) == 1 else "(" + " AND ".join(terms) + ")"

    def negation(self) -> str:
        if self.peek() in ("!", "not"):
            self.take()
            return f"(NOT {self.negation()})"
        return self.atom()

    def atom(self) -> str:
        token = self.take()
        if token == "(":
            inner = self.expression()
            if self.take() != ")":
                raise Untranslated("unbalanced parenthesis")
            return inner
        if token == "frame":
            return "TRUE"
        field = FIELDS.get(token)
        following = self.peek()
        if field is None:
            if token in PROTOCOLS and following not in (*OPERATORS, "in"):
                return f"list_contains(string_split(protocols, ':'), '{token}')"
            raise Untranslated(token)
        if following in OPERATORS:
            self.take()
            return _compare(field, OPERATORS[following], _value(field, self.take()))
        if following == "in":
            self.take()
            return _member(field, self._set())
        return "(" + " OR ".join(f"{c} IS NOT NULL" for c in field.columns) + ")"

    def _set(self) -> list[str]:
        """`{v1, v2, ...}`: Wireshark 4.0 wants the commas (`{1 2}` is an error there, so not translated)."""
        if self.take() != "{":
            raise Untranslated("`in` takes a set")
        values = [self.take()]
        while (token := self.take()) != "}":
            if token != ",":
                raise Untranslated("set members are separated by commas")
            values.append(self.take())
        if any(v in ("{", "}", ",") for v in values):
            raise Untranslated("a set member is missing")
        return values


def _value(field: Field, text: str) -> str:
    """The literal as SQL, in the form the index stores (an address as tshark prints it)."""
    try:
        if field.kind == "ipv4":
            return f"'{ipaddress.IPv4Address(text)}'"
        if field.kind == "ipv6":
            return f"'{ipaddress.IPv6Address(text).compressed}'"
        return str(int(text, 0) if not re.fullmatch(r"0[0-7]+", text) else int(text, 8))
    except ValueError:
        raise Untranslated(text) from None


def _compare(field: Field, op: str, value: str) -> str:
    if not field.many:
        return f"coalesce({field.columns[0]} {'=' if op == '==' else op} {value}, false)"
    if op == "!=":
        # Every occurrence differs, and there is one: Wireshark 4.0's `!=` ("all not equal").
        present = " OR ".join(f"len(coalesce({c}, [])) > 0" for c in field.columns)
        equal = " OR ".join(f"list_contains(coalesce({c}, []), {value})" for c in field.columns)
        return f"(({present}) AND NOT ({equal}))"
    sql_op = "=" if op == "==" else op
    return "(" + " OR ".join(f"len(list_filter(coalesce({c}, []), lambda x: x {sql_op} {value})) > 0"
                             for c in field.columns) + ")"


def _member(field: Field, texts: list[str]) -> str:
    values = ", ".join(_value(field, t) for t in texts)
    if not field.many:
        return f"coalesce({field.columns[0]} IN ({values}), false)"
    return "(" + " OR ".join(f"len(list_filter(coalesce({c}, []), lambda x: x IN ({values}))) > 0"
                             for c in field.columns) + ")"
