"""The speculative modes, one row each: what a mode runs and how SGLang is asked for it. The reference engine,
the SGLang plugin, its gates and the reference server's flags read a mode's row (`MODES`, `Mode.spec`) instead
of naming modes; opsctl keeps the same table in `opsctl/modes.py` (hosts install the runtime without opsctl,
and opsctl runs without the runtime), and tests/unit/test_modes.py checks the two are equal.

Adding a mode: a member of `Mode` and its row here and in opsctl/modes.py (docs/architecture.md, "Modes")."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Mode(StrEnum):
    """A service's decoding mode (the same names as opsctl's inventory)."""

    BASELINE = "baseline"  # target only, one token per forward
    LINEAR = "linear"  # DFlash: verify the drafted chain
    SHADOW = "shadow"  # linear's tokens, plus the DDTree tree built and logged on the side
    TREE = "tree"  # DDTree: verify the whole tree in one forward

    @property
    def spec(self) -> ModeSpec:
        return MODES[self]


@dataclass(frozen=True)
class ModeSpec:
    drafts: bool  # a drafter runs (a draft model is needed): the mode is speculative
    algorithm: str  # SGLang's --speculative-algorithm ("" for none)
    builds_tree: bool  # DDTree's trees are built (the DDTREE_* knobs apply; DDTREE_VERIFY names the mode)
    verifies_tree: bool  # the target verifies the whole tree in one forward (else the drafted chain, or nothing)
    eager_draft_head: bool  # reads DFLASH's per-position draft distributions: SGLang's eager draft sampler


MODES: dict[Mode, ModeSpec] = {
    Mode.BASELINE: ModeSpec(drafts=False, algorithm="", builds_tree=False, verifies_tree=False, eager_draft_head=False),
    Mode.LINEAR: ModeSpec(
        drafts=True, algorithm="DFLASH", builds_tree=False, verifies_tree=False, eager_draft_head=False
    ),
    Mode.SHADOW: ModeSpec(
        drafts=True, algorithm="DDTREE", builds_tree=True, verifies_tree=False, eager_draft_head=True
    ),
    Mode.TREE: ModeSpec(drafts=True, algorithm="DDTREE", builds_tree=True, verifies_tree=True, eager_draft_head=False),
}


def tree_modes() -> tuple[Mode, ...]:
    """The modes DDTREE_VERIFY names: those that build DDTree's trees."""
    return tuple(mode for mode, spec in MODES.items() if spec.builds_tree)


def mode_of(algorithm: str, verify: str | None) -> Mode:
    """The mode a server's flags ask for: SGLang's speculative algorithm ("" for none) and, where several modes
    share it, DDTREE_VERIFY. A combination no row has: ValueError, one line."""
    rows = [mode for mode, spec in MODES.items() if spec.algorithm == algorithm.upper()]
    if len(rows) == 1:
        return rows[0]
    named = [mode for mode in rows if mode.value == verify]
    if not named:
        choices = " or ".join(mode.value for mode in rows) or "nothing"
        raise ValueError(f"DDTREE_VERIFY={verify!r}: expected {choices}")
    return named[0]
