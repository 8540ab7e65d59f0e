"""Argument coercion for the tools.

Argument values arrive from the DSML parser either as raw strings (string="true") or as already
decoded JSON values (string="false"), so every coercion helper accepts both forms. Integers parse
strictly and are clamped; an unparseable optional value falls back to its default, as the reference
agent does (agent-reference.md §5), so a sloppy `max_lines="50 lines"` still reads something.

    arg_str, arg_int, arg_float, arg_bool   one argument, with its default
    parse_int, parse_float                  the strict parses underneath
    unencodable(args)                       why a call's arguments cannot be written as UTF-8
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal, overload

from ds4agent.tools.results import ToolError

_MISSING = object()


def _first(args: Mapping[str, Any], name: str) -> Any:
    return args.get(name, _MISSING)


@overload
def arg_str(args: Mapping[str, Any], name: str, *, required: Literal[True]) -> str: ...
@overload
def arg_str(args: Mapping[str, Any], name: str, *, default: str) -> str: ...
@overload
def arg_str(args: Mapping[str, Any], name: str, *, required: bool = False, default: None = None) -> str | None: ...
def arg_str(args: Mapping[str, Any], name: str, *, required: bool = False, default: str | None = None) -> str | None:
    """Text argument: a required one raises ToolError when missing; else missing -> default."""
    value = _first(args, name)
    if value is _MISSING or value is None:
        if required:
            raise ToolError(f"missing required parameter: {name}")
        return default
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    # Arrays/objects given where text was expected: their JSON text is the most faithful string.
    return json.dumps(value, ensure_ascii=False)


def parse_int(value: Any) -> int | None:
    """Strict integer parse: an int, an integral float, or a decimal string (surrounding blanks ok)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        s = value.strip()
        body = s[1:] if s[:1] in "+-" else s
        if body.isascii() and body.isdigit():
            return int(s)
    return None


def parse_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        f = float(value)
    elif isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


@overload
def arg_int(args: Mapping[str, Any], name: str, default: int, lo: int | None = None, hi: int | None = None) -> int: ...
@overload
def arg_int(args: Mapping[str, Any], name: str, default: None, lo: int | None = None,
            hi: int | None = None) -> int | None: ...
def arg_int(args: Mapping[str, Any], name: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
    """Integer argument: missing or unparseable -> default; parsed values are clamped to lo..hi."""
    value = _first(args, name)
    parsed = None if value is _MISSING else parse_int(value)
    if parsed is None:
        return default
    if lo is not None:
        parsed = max(lo, parsed)
    if hi is not None:
        parsed = min(hi, parsed)
    return parsed


def arg_float(args: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = _first(args, name)
    parsed = None if value is _MISSING else parse_float(value)
    if parsed is None:
        return default
    return min(hi, max(lo, parsed))


_TRUE = {"true", "yes", "1"}
_FALSE = {"false", "no", "0"}


def arg_bool(args: Mapping[str, Any], name: str, default: bool) -> bool:
    """true/yes/1 and false/no/0 (any case); anything else -> default."""
    value = _first(args, name)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        s = value.strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
    return default


def unencodable(value: object, where: str = "") -> str | None:
    """Why `value` (a call's arguments) cannot be written as UTF-8: a lone surrogate (a JSON
    "\\ud800" escape) in some string; None when it can."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return f"argument {where or 'text'} holds a lone surrogate (U+{ord(value[err.start]):04X})"
        return None
    if isinstance(value, Mapping):
        items: Iterable[tuple[object, object]] = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        name = f"{where}.{key}" if where else str(key)
        why = unencodable(key, name) if isinstance(key, str) else None
        if why is None:
            why = unencodable(item, name)
        if why is not None:
            return why
    return None
