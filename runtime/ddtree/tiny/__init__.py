"""Tiny target + DFlash drafter + byte tokenizer, for CPU tests, the lab and demos.

`python -m ddtree.tiny --arch {qwen3,qwen3_5} --out DIR [--seed N]` writes:

- DIR/target: a stock transformers model (Qwen3ForCausalLM, or Qwen3_5ForCausalLM with three Gated DeltaNet
  layers and one attention layer), fp32, briefly trained on a synthetic chat corpus so its greedy answers are
  confident and structured; plus the byte-level tokenizer with a Qwen-style chat template.
- DIR/draft: a DFlash drafter (`ddtree.drafter`) distilled from that target's own greedy generations and hidden
  states.
- DIR/build.json: seed, shapes, losses, timings and the acceptance length measured on held-out prompts.

Everything is seeded and runs a fixed number of steps, so one seed (and one thread count) gives the same files.

`import ddtree.tiny` is light (no torch): the build's names (`build`, `BuildSettings`, `chat_prompt_ids`, ...)
load from `ddtree.tiny.pipeline` on first use, so `python -m ddtree.tiny` refuses bad arguments at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ddtree.tiny_version import BUILD_VERSION

from .arch import Arch

if TYPE_CHECKING:
    from .pipeline import TARGET_LAYER_IDS, BuildSettings, build, chat_prompt_ids

__all__ = ["BUILD_VERSION", "TARGET_LAYER_IDS", "Arch", "BuildSettings", "build", "chat_prompt_ids"]


def __getattr__(name: str) -> Any:
    if name in ("TARGET_LAYER_IDS", "BuildSettings", "build", "chat_prompt_ids"):
        return getattr(importlib.import_module("ddtree.tiny.pipeline"), name)
    raise AttributeError(f"module 'ddtree.tiny' has no attribute {name!r}")
