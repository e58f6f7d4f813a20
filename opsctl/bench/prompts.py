"""Benchmark prompt sets: the shipped default or a user's YAML file of the same shape."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from opsctl.errors import OpsctlError


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    prompt: str


def load_prompts(path: Path | None = None) -> tuple[BenchPrompt, ...]:
    source = str(path) if path else "the default prompt set"
    try:
        text = path.read_text() if path else resources.files("opsctl").joinpath("data/prompts/bench.yaml").read_text()
        data: Any = yaml.safe_load(text)
    except OSError as exc:
        raise OpsctlError(f"cannot read prompts {source}: {exc.strerror}", "pass an existing --prompts file") from None
    except yaml.YAMLError:
        raise OpsctlError(f"{source}: YAML syntax error", "fix the prompts file") from None
    items = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise OpsctlError(f"{source}: expected `prompts:` with a list of {{id, category, prompt}}")
    prompts: list[BenchPrompt] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"].strip():
            raise OpsctlError(f"{source}: prompts[{index}] needs a non-empty `prompt` string")
        prompts.append(
            BenchPrompt(
                id=str(item.get("id", f"p{index}")),
                category=str(item.get("category", "user")),
                prompt=item["prompt"],
            )
        )
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise OpsctlError(f"{source}: prompt ids must be unique")
    return tuple(prompts)
