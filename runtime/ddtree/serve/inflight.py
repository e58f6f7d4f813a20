"""In-flight generation requests, counted at the HTTP edge: from the request's arrival until the last byte of
its response (a stream included). `/get_load` reports it, so a router (or opsctl draining a worker before a
deploy) knows when nothing is left in flight."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")


class Inflight:
    """The count (one event loop touches it: no lock)."""

    def __init__(self) -> None:
        self.count = 0


class InflightMiddleware:
    """Pure ASGI middleware (BaseHTTPMiddleware would count a stream as done once its headers are sent)."""

    def __init__(self, app: ASGIApp, inflight: Inflight) -> None:
        self.app = app
        self.inflight = inflight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        self.inflight.count += 1
        done = False

        async def send_counting(message: Message) -> None:
            nonlocal done
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False) and not done:
                done = True
                self.inflight.count -= 1

        try:
            await self.app(scope, receive, send_counting)
        finally:
            if not done:
                done = True
                self.inflight.count -= 1
