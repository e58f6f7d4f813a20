"""Request size: a body is measured, and refused when too large, before it is parsed or tokenized.

SGLang 0.5.23 has no body limit: it tokenizes any prompt (off its event loop) and only then compares the token
count with the context length. Here the bound is derived from the context length, so no prompt that could
fit is refused: a token costs at most a few bytes of JSON (``\\uXXXX`` escapes included), 32 per context
token is generous, and 1 MiB more covers the rest of the body.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request

from ddtree.serve.disconnect import ClientGone
from ddtree.serve.protocol import RequestError

BYTES_PER_CONTEXT_TOKEN = 32
BODY_SLACK_BYTES = 1 << 20
DRAIN_MAX_BYTES = 64 << 20  # read (and drop) this much of a refused body, so the client gets the answer


def max_body_bytes(context_len: int) -> int:
    return context_len * BYTES_PER_CONTEXT_TOKEN + BODY_SLACK_BYTES


def _too_large(size: int, limit: int, context_len: int) -> RequestError:
    return RequestError(
        f"Request body too large: {size} bytes, over this server's limit of {limit} bytes "
        f"({BYTES_PER_CONTEXT_TOKEN} per token of the {context_len}-token context, plus 1 MiB); "
        "send a shorter prompt",
        status=413,
    )


async def read_body(request: Request, context_len: int) -> bytes:
    """The body, or a 413 as soon as Content-Length or the bytes received pass the limit. A refused body is
    still drained (up to DRAIN_MAX_BYTES) without being kept: a client that sends its whole body before
    reading (most do) then sees the 413 rather than a reset connection. A client that disconnects mid-upload is
    `ClientGone` (a 499 nobody reads, no error log: anyone could otherwise flood the log with tracebacks)."""
    limit = max_body_bytes(context_len)
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else 0
    chunks: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit or size > limit:
                chunks.clear()
                if received > DRAIN_MAX_BYTES:
                    break
                continue
            chunks.append(chunk)
    except ClientDisconnect:  # the client left mid-upload: nothing to answer, nothing to log as an error
        raise ClientGone from None
    if received > limit or size > limit:
        raise _too_large(max(size, received), limit, context_len)
    return b"".join(chunks)
