"""API key check, as SGLang's middleware: ``Authorization: Bearer <key>``; health and metrics are exempt.

A pure ASGI middleware (as SGLang 0.5.23's ``_ApiKeyASGIMiddleware``): Starlette's BaseHTTPMiddleware hides the
client's ``http.disconnect`` from the route, and a non-stream request is aborted on exactly that message.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

EXEMPT_PREFIXES = ("/health", "/ready", "/metrics")
_UNAUTHORIZED = json.dumps({"error": "Unauthorized"}, separators=(",", ":")).encode()  # SGLang's bytes


def is_exempt(path: str, method: str) -> bool:
    return method == "OPTIONS" or path.startswith(EXEMPT_PREFIXES)


def authorized(header: str | None, key: str) -> bool:
    """SGLang's comparison: the header split once on a space, scheme ``bearer`` in any case, and the rest equal
    to the key byte for byte (``Bearer  KEY``, with two spaces, is refused); constant time."""
    if not header:
        return False
    parts = header.split(" ", 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return False
    return hmac.compare_digest(parts[1].encode("utf-8", "surrogateescape"), key.encode("utf-8", "surrogateescape"))


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_exempt(scope.get("path", ""), scope.get("method", "")):
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if authorized(header.decode("latin-1") if header is not None else None, self.key):
            await self.app(scope, receive, send)
            return
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(_UNAUTHORIZED)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": _UNAUTHORIZED})
