"""The runtime tier's two parts (tests/runtime/runtime_parts.py): every module in exactly one, neither empty."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"
sys.path.insert(0, str(RUNTIME))
import runtime_parts  # noqa: E402

sys.path.remove(str(RUNTIME))


def test_each_module_is_in_exactly_one_part(monkeypatch: pytest.MonkeyPatch) -> None:
    modules = {p.name for p in RUNTIME.glob("test_*.py")}
    assert modules >= runtime_parts.SECOND  # a renamed module would silently move to part 1
    picked = {}
    for which in runtime_parts.PARTS:
        monkeypatch.setenv("OPSCTL_RUNTIME_PART", which)
        picked[which] = {m for m in modules if runtime_parts.in_part(m)}
    assert all(picked.values())
    assert picked["1"] | picked["2"] == modules and not picked["1"] & picked["2"]
    monkeypatch.delenv("OPSCTL_RUNTIME_PART")
    assert all(runtime_parts.in_part(m) for m in modules)  # unset: the whole tier


@pytest.mark.parametrize("value", ["3", "0", " 1", "1\n", "all"])
def test_a_bad_part_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("OPSCTL_RUNTIME_PART", value)
    with pytest.raises(runtime_parts.RuntimePartError, match="must be 1 or 2"):
        runtime_parts.part()
