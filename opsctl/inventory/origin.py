"""Where an inherited value was written: a bad value a host or service takes from `defaults:` is reported under
the defaults' key path (`defaults.cuda.driver_package`), not under a host path that is not in the file
(`hosts.ct200.cuda.driver_package`). Mappings merge one level deep (load._merged), so a sub-key is blamed on
whichever side wrote it."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opsctl.errors import InventoryError

_FIRST = re.compile(r"\.?([^.\[]+|\[[^\]]*\])(.*)", re.DOTALL)  # `.key` or `['odd key']`, then the rest


def _split(rest: str) -> tuple[str, str] | None:
    """`.cuda.driver_package` -> ("cuda", ".driver_package"); None when nothing is left."""
    match = _FIRST.fullmatch(rest)
    if not rest or match is None:
        return None
    return match.group(1), match.group(2)


def real_path(error_path: str, path: str, own: Mapping[str, Any], defaults: Mapping[str, Any], at: str) -> str:
    """`error_path` (under `path`, whose own data is `own`) moved under `at` (where `defaults` was written)
    when the value it names was inherited rather than written under `path`."""
    if not error_path.startswith(path) or not isinstance(own, Mapping) or not isinstance(defaults, Mapping):
        return error_path
    first = _split(error_path[len(path) :])
    if first is None or error_path[len(path) : len(path) + 1] not in (".", "["):
        return error_path
    key, rest = first
    if key not in defaults:
        return error_path  # nothing inherited (a missing required key stays the host's)
    if key not in own:
        return f"{at}.{key}{rest}"
    mine, theirs = own[key], defaults[key]
    second = _split(rest)
    if isinstance(mine, Mapping) and isinstance(theirs, Mapping) and second is not None:
        sub = second[0]
        if sub not in mine and sub in theirs:
            return f"{at}.{key}{rest}"
    return error_path


@contextmanager
def inherited(path: str, own: Any, defaults: Any, at: str) -> Iterator[None]:
    """InventoryErrors raised inside name the defaults' path (`at`) for values `own` inherited."""
    try:
        yield
    except InventoryError as exc:
        moved = real_path(exc.path, path, own, defaults, at)
        if moved == exc.path:
            raise
        raise InventoryError(moved, exc.detail, exc.hint) from None
