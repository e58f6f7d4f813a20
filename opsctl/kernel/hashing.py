"""The sha256 of a local file, read in chunks: a model's files (their manifests) and the runtime wheel (its
content-addressed place on a host) are hashed the same way."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 8 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
