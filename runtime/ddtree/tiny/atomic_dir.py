"""A directory built beside its final path and renamed into place, so the path is either absent or complete."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def build_into(out: Path, make: Callable[[Path], T]) -> T:
    """Run `make(partial)` on a fresh sibling directory, then replace `out` with it; on failure nothing of the
    partial build is left behind and `out` is untouched."""
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    partial.mkdir(parents=True)
    try:
        result = make(partial)
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    finally:
        if partial.exists():
            shutil.rmtree(partial)
    return result
