"""API key check, as SGLang's middleware: ``Authorization: Bearer <key>``; health and metrics are exempt."""

from __future__ import annotations

import hmac

EXEMPT_PREFIXES = ("/health", "/ready", "/metrics")


def is_exempt(path: str, method: str) -> bool:
    return method == "OPTIONS" or path.startswith(EXEMPT_PREFIXES)


def authorized(header: str | None, key: str) -> bool:
    """Constant-time comparison of the bearer token with the configured key."""
    if header is None:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), key.encode())
