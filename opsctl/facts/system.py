"""Facts about disk space and interpreters: pure parsers over `df -P -B1` and `python --version`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from opsctl.errors import FactError


@dataclass(frozen=True)
class DiskSpace:
    mount: str
    size: int  # bytes
    used: int
    available: int


def parse_df(text: str) -> DiskSpace:
    """Parse `df -P -B1 PATH` (POSIX format: one data line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or not lines[0].startswith("Filesystem"):
        raise FactError("df: expected a header and one data line")
    fields = lines[-1].split()
    if len(fields) < 6:
        raise FactError(f"df: expected 6 columns, got {lines[-1].strip()!r}")
    try:
        size, used, available = int(fields[1]), int(fields[2]), int(fields[3])
    except ValueError:
        raise FactError(f"df: sizes are not byte counts in {lines[-1].strip()!r} (use -B1)") from None
    return DiskSpace(" ".join(fields[5:]), size, used, available)


def parse_python_version(exit_code: int, text: str) -> tuple[int, int, int] | None:
    """'Python 3.11.2' -> (3, 11, 2); None when the interpreter does not exist."""
    if exit_code != 0:
        return None
    match = re.search(r"Python (\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise FactError(f"python --version: unexpected output {text.strip()!r}")
    return int(match[1]), int(match[2]), int(match[3])


def size_iec(n: int) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1: `1.8 MiB`, `2.00 GiB`, `512 B` (a model of
    1.8 MB read `0.00 GiB`)."""
    for unit, scale, digits in (("GiB", 2**30, 2), ("MiB", 2**20, 1), ("KiB", 2**10, 1)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n} B"
