"""Secrets by reference. The inventory names where a secret lives (`env:NAME` or `file:PATH`), never its value.

`SecretRef` prints as `***` everywhere (repr, str, JSON); only `reveal()` reads the value. Its callers:
the renderer (`render.server_options`, for server.yaml's 0600 copy on the host), `deploy.staged` (the
secrets' salted fingerprint, `secrets.fp`) and `health.auth_headers` (the Bearer header of HTTP requests to
the service). A revealed value travels to a host only inside a 0600 file (`put_text`), never on a command line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.errors import OpsctlError

MASK = "***"
# Full match: an env var name, or a path of printable characters (no control characters, no newline).
_REF = re.compile(r"env:[A-Za-z_][A-Za-z0-9_]{0,127}|file:[^\x00-\x1f\x7f-\x9f]{1,1024}")


class SecretError(OpsctlError):
    pass


@dataclass(frozen=True)
class SecretRef:
    """Where a secret lives: `env:NAME` or `file:PATH`. The value is read only on reveal()."""

    ref: str = field(repr=False)

    @staticmethod
    def is_reference(text: str) -> bool:
        return bool(_REF.fullmatch(text))

    @property
    def source(self) -> str:
        """Safe to show: the reference itself (an env var name or a path), never the value."""
        return self.ref

    def reveal(self) -> str:
        kind, _, where = self.ref.partition(":")
        if kind == "env":
            value = os.environ.get(where)
            if value is None:
                raise SecretError(f"secret {self.ref}: environment variable {where} is not set", f"export {where}=...")
            return value
        path = Path(where).expanduser()
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise SecretError(f"secret {self.ref}: cannot read {path}: {exc.strerror}", "create the file") from None

    def __str__(self) -> str:
        return MASK

    def __repr__(self) -> str:
        return f"SecretRef({MASK})"


def mask(text: str, secrets: list[str]) -> str:
    """Replace every revealed secret value in `text` with ***."""
    for value in secrets:
        if value:
            text = text.replace(value, MASK)
    return text
