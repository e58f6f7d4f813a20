"""Rollout planning: canary first, then batches, stopping once failures exceed --max-fail. Pure.

The unit of rollout is one (host, service) target. A batch runs its hosts in parallel; a host's services run
one after another under that host's deploy lock. An unreachable host fails every target it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from opsctl.deploy.outcome import Outcome

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    host: str
    service: str

    def __str__(self) -> str:
        return f"{self.host}/{self.service}"


def plan_batches(targets: Sequence[T], canary: bool, batch: int | None) -> list[list[T]]:
    """Split targets into batches: [first] alone when canary, then groups of `batch` (None = all the rest)."""
    if batch is not None and batch < 1:
        raise ValueError("batch size must be >= 1")
    rest = list(targets)
    batches: list[list[T]] = []
    if canary and rest:
        batches.append([rest.pop(0)])
    size = batch or len(rest) or 1
    for i in range(0, len(rest), size):
        batches.append(rest[i : i + size])
    return batches


def group_by_host(batch: Sequence[Target]) -> dict[str, list[Target]]:
    """Targets of one batch per host, in first-seen order (each host's services run sequentially)."""
    groups: dict[str, list[Target]] = {}
    for target in batch:
        groups.setdefault(target.host, []).append(target)
    return groups


def should_continue(failures: int, max_fail: int) -> bool:
    """Keep rolling out while cumulative failures do not exceed max_fail."""
    return failures <= max_fail


def count_failures(outcomes: Sequence[Outcome]) -> int:
    return sum(1 for o in outcomes if o.failed)
