"""Small typed readers for YAML values. Each names the key path in its error and says what was expected.

Strings are checked against their kind's rule (opsctl.inventory.rules); values in messages are excerpts.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

from opsctl.errors import InventoryError
from opsctl.inventory.rules import Kind, check, excerpt

E = TypeVar("E", bound=Enum)

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]{1,40}")


def describe(value: Any) -> str:
    if value is None:
        return "nothing"
    for kind, words in (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "a list"),
        (dict, "a mapping"),
    ):
        if isinstance(value, kind):
            return words
    return "a " + type(value).__name__


def mapping(value: Any, path: str, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise InventoryError(path, f"expected a mapping, got {describe(value)}")
    for key in value:
        if not isinstance(key, str):
            raise InventoryError(path, f"key {excerpt(key)} must be a string")
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"expected one of: {', '.join(sorted(allowed))}"
            raise InventoryError(join(path, key), "unknown key", hint)
    for key in sorted(required):
        if key not in value:
            raise InventoryError(join(path, key), "required key is missing")
    return dict(value)


def join(path: str, key: str | int) -> str:
    """`path.key`, `path[3]`, or `path['odd key']` (escaped excerpt) for a key that is not a plain word."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _PLAIN_KEY.fullmatch(key):
        return f"{path}[{excerpt(key)}]"
    return f"{path}.{key}" if path else key


def string(value: Any, path: str, kind: Kind) -> str:
    """A string of `kind`. A number written unquoted is taken as written (`0.85` -> "0.85")."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        hint = "quote it" if not isinstance(value, list | dict) and value is not None else None
        raise InventoryError(path, f"expected a string, got {describe(value)}", hint)
    text = getattr(value, "source", None) or (value if isinstance(value, str) else repr(value))
    if not text:
        raise InventoryError(path, "must not be empty")
    return check(text, kind, path)


def name(value: Any, path: str) -> str:
    return string(value, path, Kind.NAME)


def abs_path(value: Any, path: str) -> str:
    return string(value, path, Kind.HOST_PATH).rstrip("/") or "/"


def integer(value: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InventoryError(path, f"expected an integer, got {describe(value)}")
    if not lo <= value <= hi:
        raise InventoryError(path, f"{excerpt(value)} is out of range ({lo}..{hi})")
    return int(value)


def number(value: Any, path: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InventoryError(path, f"expected a number, got {describe(value)}")
    if not lo <= value <= hi:  # NaN is never in range
        raise InventoryError(path, f"{excerpt(value)} is out of range ({lo:g}..{hi:g})")
    return float(value)


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise InventoryError(path, f"expected true or false, got {describe(value)}")
    return value


def choice(value: Any, path: str, enum: type[E]) -> E:
    options = [str(m.value) for m in enum]
    if not isinstance(value, str) or value not in options:
        raise InventoryError(path, f"expected one of {', '.join(options)}, got {excerpt(value)}")
    return enum(value)


def string_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise InventoryError(path, f"expected a list, got {describe(value)}")
    return value
