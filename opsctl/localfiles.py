"""Files on the control machine that several opsctl processes may write at once (two provisions of one model
source, two lab parts in one CI run): each writer fills a temporary file of its own beside the target, then
renames it over the target, so readers see a whole old or a whole new file and no writer removes another's.
Where they live: `state_dir()`."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def state_dir() -> Path:
    """opsctl's state on the control machine (audit logs, model trust records): `$XDG_STATE_HOME/opsctl`,
    `~/.local/state/opsctl` when the variable is unset or empty."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "opsctl"


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (parent dirs made; the file's mode from the umask, as `Path.write_text` gives).
    The temporary file is unique to this call: a fixed name (`path.tmp`) let a second writer rename it away first,
    and the first failed with FileNotFoundError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
