"""Benchmark prompt sets: the shipped default or a user's YAML file of the same shape (read by opsctl.chat)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opsctl.chat import load_prompt_items


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    prompt: str


def load_prompts(path: Path | None = None) -> tuple[BenchPrompt, ...]:
    """`prompts: [{id, category, prompt}, ...]` (id and category optional; a smoke file's `max_tokens` is allowed,
    bench's --max-tokens applies instead)."""
    _, items = load_prompt_items(path, "bench.yaml")
    return tuple(BenchPrompt(pid, str(item.get("category", "user")), item["prompt"]) for pid, item in items)
