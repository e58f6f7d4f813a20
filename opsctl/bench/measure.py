"""One streamed chat request, timed: wall time, time to first token, completion tokens (from usage)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from opsctl.errors import OpsctlError


@dataclass(frozen=True)
class Sample:
    prompt_id: str
    repeat: int
    completion_tokens: int
    wall_s: float  # request sent -> last byte
    ttft_s: float  # request sent -> first generated text (content or reasoning)
    finish_reason: str

    @property
    def tok_s(self) -> float:
        """Output tokens per second of wall time (the user-visible rate, prefill included)."""
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0


def parse_stream(lines: list[tuple[float, str]]) -> tuple[float | None, int | None, str | None]:
    """From (arrival time, SSE line) pairs: time of the first text delta, usage.completion_tokens, finish reason."""
    first: float | None = None
    tokens: int | None = None
    finish: str | None = None
    for at, line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            event = json.loads(payload)
        except ValueError:
            continue
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if first is None and (delta.get("content") or delta.get("reasoning_content")):
                first = at
            finish = choice.get("finish_reason") or finish
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"]
    return first, tokens, finish


def verify_rounds(lines: list[tuple[float, str]]) -> int | None:
    """SGLang's verify rounds for the request (`sglext.spec_tokens_details.spec_verify_ct`, sent when the body
    asks for `return_spec_tokens_details`), None when the stream carries none."""
    for _, line in lines:
        if not line.startswith("data:") or "spec_verify_ct" not in line:
            continue
        try:
            details = (json.loads(line[5:].strip()).get("sglext") or {}).get("spec_tokens_details")
        except (ValueError, AttributeError):
            continue
        if isinstance(details, dict) and isinstance(details.get("spec_verify_ct"), int):
            return int(details["spec_verify_ct"]) or None
    return None


def stream_chat(
    client: httpx.Client, url: str, body: dict[str, object], headers: dict[str, str], timeout: float
) -> tuple[float, float, int, str]:
    """POST a streaming chat completion; returns (wall_s, ttft_s, completion_tokens, finish_reason)."""
    wall, ttft, tokens, finish, _ = stream_chat_rounds(client, url, body, headers, timeout)
    return wall, ttft, tokens, finish


def stream_chat_rounds(
    client: httpx.Client, url: str, body: dict[str, object], headers: dict[str, str], timeout: float
) -> tuple[float, float, int, str, int | None]:
    """`stream_chat` plus the server's verify rounds for the request (`verify_rounds`)."""
    start = time.perf_counter()
    lines: list[tuple[float, str]] = []
    try:
        with client.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
            if response.status_code != 200:
                response.read()
                raise OpsctlError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
            for line in response.iter_lines():
                lines.append((time.perf_counter() - start, line))
    except httpx.HTTPError as exc:
        raise OpsctlError(f"{url}: {type(exc).__name__}: {exc}", "check the service with `opsctl status`") from None
    wall = time.perf_counter() - start
    first, tokens, finish = parse_stream(lines)
    if tokens is None:
        raise OpsctlError(f"{url}: the stream carried no usage", "the server must honour stream_options.include_usage")
    return wall, first if first is not None else wall, tokens, finish or "unknown", verify_rounds(lines)
