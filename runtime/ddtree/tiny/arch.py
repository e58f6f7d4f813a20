"""The tiny models' architectures (no torch here: `python -m ddtree.tiny` checks its arguments before importing
the build)."""

from __future__ import annotations

import enum


class Arch(enum.StrEnum):
    QWEN3 = "qwen3"
    QWEN3_5 = "qwen3_5"
