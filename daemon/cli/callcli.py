"""`diagd call`: argument parsing and the visibility banner (stdlib only)."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any, TextIO

RULE = "─" * 60


class ArgumentError(ValueError):
    pass


def parse_arguments(tokens: list[str], args_json: str | None = None) -> dict[str, Any]:
    """`key=value` tokens (value parsed as JSON when it parses) merged over --args-json.

    Tokens may carry backslash-newline continuations when a multi-line command reaches us in
    one quoted string (pasted from docs, or through a launcher that does not run a shell).
    """
    arguments: dict[str, Any] = {}
    if args_json:
        try:
            loaded = json.loads(args_json)
        except json.JSONDecodeError as exc:
            raise ArgumentError(f"--args-json is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise ArgumentError("--args-json must be a JSON object")
        arguments.update(loaded)
    for token in _split_continuations(tokens):
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ArgumentError(f"argument {token!r} is not key=value")
        arguments[key] = parse_value(value)
    return arguments


def split_raw(tokens: list[str]) -> tuple[list[str], list[str]]:
    """(the `key=value` tokens, the words without `=`): a raw word is taken by `take_raw`, not refused."""
    pairs: list[str] = []
    raw: list[str] = []
    for token in _split_continuations(tokens):
        (pairs if "=" in token else raw).append(token)
    return pairs, raw


def take_raw(raw: list[str], arguments: dict[str, Any], schema: dict[str, Any]) -> list[tuple[str, str]]:
    """Give each raw word, in order, to the tool's next required argument not given yet (in place).

    Returns (word, argument) pairs for the banner. A word left without a slot is refused: diagd
    never guesses a name the tool did not ask for.
    """
    free = [k for k in schema.get("required", []) if k not in arguments]
    taken: list[tuple[str, str]] = []
    for word in raw:
        if not free:
            raise ArgumentError(f"argument {word!r} is not key=value, and every required argument is given")
        key = free.pop(0)
        kind = schema.get("properties", {}).get(key, {}).get("type")
        arguments[key] = word if kind == "string" else parse_value(word)
        taken.append((word, key))
    return taken


OPTIONS = ("--visibility", "--args-json")


def split_options(tokens: list[str]) -> tuple[list[str], dict[str, str]]:
    """Pull `--visibility X` / `--args-json X` (or `--opt=X`) out of the key=value tokens.

    The tool's arguments are free-form, so argparse only sees them as a remainder; options may
    come before or after them.
    """
    rest: list[str] = []
    options: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token.partition("=")
        if name in OPTIONS:
            if not eq:
                if i + 1 >= len(tokens):
                    raise ArgumentError(f"{name} needs a value")
                value = tokens[i + 1]
                i += 1
            options[name[2:].replace("-", "_")] = value
        else:
            rest.append(token)
        i += 1
    if options.get("visibility", "verbose") not in ("verbose", "simple", "off"):
        raise ArgumentError("--visibility must be verbose, simple or off")
    return rest, options


def parse_value(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _split_continuations(tokens: list[str]) -> list[str]:
    out: list[str] = []
    for token in tokens:
        if token in ("\\", "\\\n"):
            continue
        if "\\\n" in token:
            out.extend(shlex.split(token.replace("\\\n", " ")))
        else:
            out.append(token)
    return out


def _pretty(arguments: dict[str, Any]) -> str:
    text = json.dumps(arguments, indent=2, ensure_ascii=False)
    return text.replace("\n", "\n   ")


def banner_before(tool: str, arguments: dict[str, Any], visibility: str, out: TextIO = sys.stderr,
                  taken: list[tuple[str, str]] | None = None) -> None:
    if visibility == "off":
        return
    out.write(f"📡 calling tool: {tool}\n")
    for word, key in taken or []:  # shown raw, and how it was taken: the user typed no key
        out.write(f"   raw: {word}  (not key=value: taken as {key}, the next required argument)\n")
    if visibility == "verbose":
        out.write(f"   args: {_pretty(arguments)}\n")
    out.flush()


def banner_after(tool: str, arguments: dict[str, Any], elapsed_s: float, visibility: str,
                 out: TextIO = sys.stderr) -> None:
    if visibility != "verbose":
        return
    out.write(f"{RULE}\n")
    out.write(f"ℹ️ source: {tool}\n")
    out.write(f"   args: {_pretty(arguments)}\n")
    out.write(f"   elapsed: {elapsed_s:.2f}s\n")
    out.write(f"{RULE}\n")
    out.flush()
