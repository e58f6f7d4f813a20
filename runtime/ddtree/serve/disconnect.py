"""A non-stream request ends when its client goes away: the generation is cancelled (the worker stops it
after the current round and counts an abort), as SGLang aborts a request whose connection closed.

Streams need none of this: Starlette's StreamingResponse already cancels the body iterator on disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def _disconnected(receive: Receive) -> None:
    """Returns on ``http.disconnect`` (the body was already read, so nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """``work``'s result; if the client disconnects first, ``work`` is cancelled and ``ClientGone`` raised."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself was cancelled: so is its work
        task.cancel()
        raise
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientGone
    return task.result()
