"""Small typed readers for YAML values. Each names the key path in its error and says what was expected."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

from opsctl.errors import InventoryError

E = TypeVar("E", bound=Enum)

SAFE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+@-]*$")
SAFE_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")
JUMP_HOST = re.compile(r"^([a-z0-9_-]+@)?[A-Za-z0-9.-]+(:\d+)?$")
SAFE_ARG = re.compile(r"^[A-Za-z0-9._=:/,+@-]+$")
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def describe(value: Any) -> str:
    if value is None:
        return "nothing"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def mapping(value: Any, path: str, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise InventoryError(path, f"expected a mapping, got {describe(value)}")
    for key in value:
        if not isinstance(key, str):
            raise InventoryError(path, f"key {key!r} must be a string")
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"expected one of: {', '.join(sorted(allowed))}"
            raise InventoryError(join(path, key), "unknown key", hint)
    for key in sorted(required):
        if key not in value:
            raise InventoryError(join(path, key), "required key is missing")
    return dict(value)


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def string(value: Any, path: str, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InventoryError(path, f"expected a string, got {describe(value)}")
    text = str(value)
    if not text:
        raise InventoryError(path, "must not be empty")
    if pattern is not None and not pattern.match(text):
        raise InventoryError(path, f"{text!r} is not {what or 'allowed'}")
    return text


def name(value: Any, path: str) -> str:
    return string(value, path, SAFE_NAME, "a safe name (lowercase letters, digits, '-', '_'; at most 40)")


def abs_path(value: Any, path: str) -> str:
    text = string(value, path)
    if not SAFE_PATH.match(text):
        raise InventoryError(path, f"{text!r} is not a safe absolute path (letters, digits, . _ / + @ - only)")
    if ".." in text.split("/"):
        raise InventoryError(path, f"{text!r} must not contain '..'")
    return text.rstrip("/") or "/"


def integer(value: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InventoryError(path, f"expected an integer, got {describe(value)}")
    if not lo <= value <= hi:
        raise InventoryError(path, f"{value} is out of range ({lo}..{hi})")
    return value


def number(value: Any, path: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InventoryError(path, f"expected a number, got {describe(value)}")
    if not lo <= value <= hi:
        raise InventoryError(path, f"{value} is out of range ({lo:g}..{hi:g})")
    return float(value)


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise InventoryError(path, f"expected true or false, got {describe(value)}")
    return value


def choice(value: Any, path: str, enum: type[E]) -> E:
    options = [str(m.value) for m in enum]
    if not isinstance(value, str) or value not in options:
        raise InventoryError(path, f"expected one of {', '.join(options)}, got {value!r}")
    return enum(value)


def string_list(value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise InventoryError(path, f"expected a list, got {describe(value)}")
    return value
