"""What smoke, equivalence and bench send to a service's OpenAI-compatible API, written once: the chat body
(temperature 0, thinking off), the served model's name, and the YAML prompt files they read.

A prompt file is `prompts: [{id: name, prompt: text, ...}, ...]`; each caller names the other keys it accepts
(smoke's `max_tokens`, bench's `category`) and turns the checked items into its own prompt type.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import yaml

from opsctl.errors import SmokeError


def chat_body(model: str, prompt: str, max_tokens: int, stream: bool = False, temperature: float = 0) -> dict[str, Any]:
    """One user turn, greedy unless `temperature`, thinking off (Qwen3.x answers in a thinking block by
    default); streamed with usage in the last event when `stream`."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": temperature,
        "max_tokens": max_tokens,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def first_model(client: httpx.Client, base: str, headers: Mapping[str, str], timeout: float) -> str:
    """The served model name from /v1/models (the name every request must carry)."""
    try:
        response = client.get(f"{base}/v1/models", headers=dict(headers), timeout=timeout)
    except httpx.HTTPError as exc:
        raise SmokeError(f"{base}/v1/models: {type(exc).__name__}: {exc}", "is the service running?") from None
    if response.status_code != 200:
        raise SmokeError(f"{base}/v1/models: HTTP {response.status_code}", "check the API key and the service")
    try:
        data = response.json()["data"]
        return str(data[0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise SmokeError(f"{base}/v1/models: no model listed", "check the server's --served-model-name") from None


# One prompt-file format for smoke and bench, so the same file serves both: smoke reads `max_tokens`, bench reads
# `category` (its --max-tokens applies to every prompt); any other key is a typo.
PROMPT_KEYS = frozenset({"id", "category", "prompt", "max_tokens"})


def load_prompt_items(
    path: Path | None, shipped: str, keys: frozenset[str] = PROMPT_KEYS
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """(where, [(id, item)]) from the user's YAML prompt file, or the shipped `opsctl/data/prompts/<shipped>`.
    Every item has a non-empty `prompt` string, only `keys`, and a unique id (`p<index>` when none)."""
    if path is None:
        text = resources.files("opsctl").joinpath(f"data/prompts/{shipped}").read_text()
        where = "the shipped prompt set"
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SmokeError(f"cannot read prompt file {path}: {exc.strerror}", "check the --prompts path") from None
        where = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SmokeError(f"{where}: not valid YAML: {str(exc).splitlines()[0]}", "fix the file") from None
    items = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise SmokeError(f"{where}: expected `prompts:` with a non-empty list", "see docs/deploy.md for the format")
    checked: list[tuple[str, dict[str, Any]]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise SmokeError(f"{where}: prompts[{i}] needs a non-empty `prompt` string", "fix the file")
        unknown = set(item) - keys
        if unknown:
            raise SmokeError(f"{where}: prompts[{i}]: unknown keys {sorted(unknown)}", f"use {', '.join(sorted(keys))}")
        pid = str(item.get("id", f"p{i}"))
        if pid in (seen for seen, _ in checked):
            raise SmokeError(f"{where}: prompts[{i}]: duplicate id {pid!r}", "ids must be unique")
        checked.append((pid, item))
    return where, checked
