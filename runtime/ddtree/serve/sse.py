"""Server-sent events as OpenAI and SGLang frame them: ``data: <json>\\n\\n`` ... ``data: [DONE]\\n\\n``."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def parse_events(body: str) -> list[dict[str, Any] | str]:
    """Inverse of ``event``/``DONE`` (for tests and clients): JSON payloads in order, ``"[DONE]"`` kept as is."""
    out: list[dict[str, Any] | str] = []
    for block in body.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        if not block.startswith("data: "):
            raise ValueError(f"not an SSE data line: {block[:60]!r}")
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
