"""A salted fingerprint of a service's secrets, so a rotated API key is noticed by the next deploy.

The release hash is computed with secrets masked: the id is printed everywhere, and a hash that covered a short
key could be brute-forced from it. Each release instead keeps `secrets.fp` (0600, root only): a random salt and
sha256(salt + secrets). A deploy whose config hash equals the current release's compares fingerprints; when
they differ the key was rotated and the deploy goes ahead with a new release.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping

FP_FILE = "secrets.fp"
_VERSION = "v1"
_SALT_BYTES = 16


def _digest(salt: bytes, secrets: Mapping[str, str]) -> str:
    h = hashlib.sha256(salt)
    for name in sorted(secrets):
        value = secrets[name].encode()
        h.update(f"{name}\0{len(value)}\0".encode() + value)
    return h.hexdigest()


def fingerprint(secrets: Mapping[str, str], salt: bytes | None = None) -> str:
    """`v1:<salt hex>:<sha256 hex>`; a fresh random salt unless one is given (tests)."""
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    return f"{_VERSION}:{salt.hex()}:{_digest(salt, secrets)}"


def matches(stored: str, secrets: Mapping[str, str]) -> bool | None:
    """True/False when `stored` is a fingerprint we can check; None when it is missing or unreadable
    (a release made before fingerprints existed: the caller cannot tell, and keeps the release)."""
    parts = stored.strip().split(":")
    if len(parts) != 3 or parts[0] != _VERSION:
        return None
    try:
        salt = bytes.fromhex(parts[1])
    except ValueError:
        return None
    return hmac.compare_digest(_digest(salt, secrets), parts[2])
