"""``x-request-id`` on every response: the client's id when it is a sane one, else a fresh one.

A pure ASGI middleware (no body buffering, so streaming and disconnect detection are untouched). The id is kept
in the ASGI scope's ``state`` so handlers and the 500 handler (which runs outside every middleware) can read it.
"""

from __future__ import annotations

import uuid
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_LEN = 128


def valid_request_id(value: str) -> bool:
    """1 to 128 printable ASCII characters, no spaces (what survives logs and header round trips unchanged)."""
    return 0 < len(value) <= MAX_REQUEST_ID_LEN and all("!" <= c <= "~" for c in value)


def choose_request_id(sent: str | None) -> str:
    return sent if sent is not None and valid_request_id(sent) else uuid.uuid4().hex


def request_id(scope: MutableMapping[str, Any]) -> str:
    """The id chosen for this request (a fresh one if the middleware did not run)."""
    state = scope.setdefault("state", {})
    if REQUEST_ID_HEADER not in state:
        state[REQUEST_ID_HEADER] = uuid.uuid4().hex
    return str(state[REQUEST_ID_HEADER])


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = [v for k, v in scope["headers"] if k.lower() == REQUEST_ID_HEADER.encode()]
        rid = choose_request_id(sent[0].decode("latin-1") if len(sent) == 1 else None)
        scope.setdefault("state", {})[REQUEST_ID_HEADER] = rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER.encode()]
                message = {**message, "headers": [*headers, (REQUEST_ID_HEADER.encode(), rid.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)
