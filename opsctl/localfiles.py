"""Files on the control machine that several opsctl processes may write at once (two provisions of one model
source, two lab parts in one CI run): each writer fills a temporary file of its own beside the target, then
renames it over the target, so readers see a whole old or a whole new file and no writer removes another's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (parent dirs made). The temporary file is unique to this call: a fixed name
    (`path.tmp`) let a second writer rename it away first, and the first failed with FileNotFoundError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
