"""libyaml where it reads YAML exactly as PyYAML's pure-Python loader does, PyYAML where it might not.

libyaml (C) reads a 1 MiB inventory 4x faster, but it words syntax errors differently and accepts some texts
PyYAML refuses (or reads otherwise). Fuzzing both on mutated YAML (tests/unit/test_inventory_reader.py) found
every disagreement involves one of the characters or patterns in PY_ONLY; a text without them reads the same.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

LIBYAML = hasattr(yaml, "CSafeLoader")  # PyYAML built with libyaml
# Tabs, a BOM inside the text, NEL/LS/PS line breaks, `?` (PyYAML refuses it inside flow plain scalars), tags
# (`!` alone, `!a,` in a flow), and a comment right after a block scalar's indicator (`|#`).
PY_ONLY = re.compile("[\\t\\ufeff\\x85\\u2028\\u2029?!]|[|>][-+0-9]*#")


def agrees(text: str) -> bool:
    """Whether libyaml is available and reads `text` as PyYAML does (data and refusal, not the message)."""
    return LIBYAML and PY_ONLY.search(text) is None


def safe_load(text: str) -> Any:
    """`yaml.safe_load(text)`, through libyaml when that gives the same result."""
    if agrees(text):
        return yaml.load(text, Loader=yaml.CSafeLoader)  # CSafeLoader: the safe loader, in C
    return yaml.safe_load(text)
