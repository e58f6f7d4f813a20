"""The speculative modes, one row each: what a mode runs and how SGLang is asked for it. The inventory's checks
(`opsctl.inventory`) and the rendered flags and environment (`opsctl.render`) read a mode's row (`MODES`,
`Mode.spec`) instead of naming modes. The runtime keeps the same table in runtime/ddtree/modes.py (hosts install
the runtime without opsctl, and opsctl runs without the runtime); tests/unit/test_modes.py checks the two are
equal.

Adding a mode: a member of `Mode` and its row here and in runtime/ddtree/modes.py (docs/architecture.md, "Modes")."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Mode(StrEnum):
    BASELINE = "baseline"  # no speculation: throughput floor and the greedy reference
    LINEAR = "linear"  # SGLang's built-in DFLASH chain verify
    SHADOW = "shadow"  # DDTREE builds and logs the tree, verifies only the spine
    TREE = "tree"  # DDTREE verifies the whole tree in one forward

    @property
    def spec(self) -> ModeSpec:
        return MODES[self]

    @property
    def speculative(self) -> bool:
        return self.spec.drafts

    @property
    def ddtree(self) -> bool:
        return self.spec.builds_tree


@dataclass(frozen=True)
class ModeSpec:
    drafts: bool  # a drafter runs (the service needs a draft model): the mode is speculative
    algorithm: str  # SGLang's --speculative-algorithm ("" for none)
    builds_tree: bool  # DDTree's trees are built: the DDTREE_* knobs are rendered, DDTREE_VERIFY names the mode
    verifies_tree: bool  # the target verifies the whole tree in one forward: the tree-only knobs apply
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
