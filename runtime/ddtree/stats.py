"""One request-round's statistics (`RoundStats`): what the DDTREE lines (`ddtree.metrics`) and the `ddtree_*`
series (`ddtree.prom`) are both made of, so neither module needs the other for it. `round_stats` splits one
batch round into its requests' RoundStats; every engine and worker records its rounds through it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddtree.tree import TreeShape

PHASES = ("draft", "build", "verify", "commit")  # a round's phases, in order (the `*_ms` fields)


@dataclass(frozen=True)
class RoundStats:
    accepted_len: int  # committed tokens this round incl. the bonus token (= len(WalkResult.accepted))
    nodes: int  # drafted tree nodes, root excluded (<= budget)
    depth: int  # deepest drafted node
    off_spine: bool  # the accepted path left the drafter's argmax chain
    draft_ms: float
    build_ms: float
    verify_ms: float
    commit_ms: float
    width: int = 0  # most nodes at one depth (1 = a chain); 0 = not reported


def round_stats(
    accepted: Sequence[int], shapes: Sequence[TreeShape], off_spine: Sequence[bool], times_ms: Mapping[str, float]
) -> list[RoundStats]:
    """One RoundStats per request of a batch round: its committed tokens (bonus included), its tree's shape and
    whether its path left the spine; the round's phase times (`PHASES`, a missing one is 0) split evenly over
    the requests."""
    bs = len(accepted)
    draft, build, verify, commit = (times_ms.get(phase, 0.0) / max(bs, 1) for phase in PHASES)
    return [
        RoundStats(
            accepted_len=int(acc),
            nodes=shape.nodes,
            depth=shape.depth,
            off_spine=bool(off),
            draft_ms=draft,
            build_ms=build,
            verify_ms=verify,
            commit_ms=commit,
            width=shape.width,
        )
        for acc, shape, off in zip(accepted, shapes, off_spine, strict=True)
    ]
