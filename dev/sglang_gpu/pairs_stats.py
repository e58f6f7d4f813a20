"""The pairs measured to +-5%: the schedule of server starts and the verdict per level, pure functions.

Each service is compared with its reference (DFLASH's `linear` for the trees, the tree for its policy service)
over several *rounds*: in every round each service of the pair is started afresh, measured at every level and
stopped, the reference first in even rounds and last in odd ones (`interleaved_rounds`), so a slow spell of the
host falls on both sides of a comparison alike. A level's ratio is taken within one round (the service's median
tok/s per request over the reference's, same round), never across rounds: a server start's own offset (the
spread that made the earlier pairs unreadable) cancels only within its round.

Per level: the ratios of the rounds, their median and range, and a 95% bootstrap interval (`bootstrap_ratio`:
resample the rounds, and within each resampled round the requests of both sides, then the median of the rounds'
ratios of medians). A level whose interval reaches more than `tolerance` (5%) from its median says so instead of
giving a number (`LevelVerdict.text`).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

TOLERANCE = 0.05


def interleaved_rounds(reference: str, services: Sequence[str], rounds: int) -> list[list[str]]:
    """The start order per round: the reference, then its comparisons; every odd round reversed."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    order = [reference, *(s for s in services if s != reference)]
    return [list(order) if i % 2 == 0 else order[::-1] for i in range(rounds)]


def ratio_of_medians(service: Sequence[float], reference: Sequence[float]) -> float:
    """The service's median tok/s per request over the reference's (one level of one round)."""
    if not service or not reference:
        raise ValueError("a level needs samples on both sides")
    return statistics.median(service) / statistics.median(reference)


def bootstrap_ratio(
    rounds: Sequence[tuple[Sequence[float], Sequence[float]]],
    resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float]:
    """A percentile interval of the median over rounds of `ratio_of_medians`, resampling the rounds and, within
    each, the requests of both sides (a start's offset and a level's request noise both show). rounds: per round
    (service samples, reference samples), tok/s per request."""
    if not rounds:
        raise ValueError("no rounds")
    rng = random.Random(seed)
    stats = []
    for _ in range(resamples):
        ratios = []
        for _ in range(len(rounds)):
            svc, ref = rounds[rng.randrange(len(rounds))]
            a = [svc[rng.randrange(len(svc))] for _ in svc]
            b = [ref[rng.randrange(len(ref))] for _ in ref]
            ratios.append(ratio_of_medians(a, b))
        stats.append(statistics.median(ratios))
    stats.sort()
    tail = (1 - confidence) / 2
    lo = stats[max(0, math.floor(tail * resamples))]
    hi = stats[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return lo, hi


@dataclass(frozen=True)
class LevelVerdict:
    level: int  # concurrency
    ratios: tuple[float, ...]  # one per round
    median: float
    interval: tuple[float, float]  # the bootstrap's
    tolerance: float = TOLERANCE

    @property
    def half_width(self) -> float:
        """How far the interval reaches from the median, relative to it."""
        lo, hi = self.interval
        return max(self.median - lo, hi - self.median) / self.median

    @property
    def readable(self) -> bool:
        return len(self.ratios) >= 3 and self.half_width <= self.tolerance

    @property
    def text(self) -> str:
        lo, hi = min(self.ratios), max(self.ratios)
        if len(self.ratios) < 3:
            return f"{len(self.ratios)} round(s): fewer than 3, no number (ratios {_list(self.ratios)})"
        if not self.readable:
            return (
                f"wider than +-{self.tolerance:.0%} (+-{self.half_width:.1%}), no number (ratios {_list(self.ratios)})"
            )
        return (
            f"{self.median:.2f}x [{lo:.2f}-{hi:.2f}] "
            f"(95% CI {self.interval[0]:.2f}-{self.interval[1]:.2f}, {len(self.ratios)} rounds)"
        )


def _list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def level_verdict(
    level: int,
    rounds: Sequence[tuple[Sequence[float], Sequence[float]]],
    tolerance: float = TOLERANCE,
    resamples: int = 2000,
    seed: int = 0,
) -> LevelVerdict:
    """One level's verdict from its rounds' (service, reference) tok/s per request."""
    ratios = tuple(ratio_of_medians(s, r) for s, r in rounds)
    return LevelVerdict(level, ratios, statistics.median(ratios), bootstrap_ratio(rounds, resamples, seed), tolerance)
