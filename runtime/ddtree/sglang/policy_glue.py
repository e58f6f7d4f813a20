"""The SGLang tree worker's side of the shape policy (`ddtree.policy`), kept apart from the worker class.

Per decode round the worker makes one call, before it drafts:

    shape = glue.next_shape(batch_size, reports)

`reports` are the `RoundReport`s of earlier rounds whose numbers have reached the host since the last call
(none most rounds: statistics stay on the device until a DDTREE line reads them, CUDA events are read once they
have completed; see `round_accepts` and `RoundTimer`). The answer is a `RoundShape`: run DFLASH's own chain round
(`is_chain`) or a tree round with `budget` nodes (<= the configured budget, so the verify window the worker
sized at start fits), and tag the round with `round_id` so its report can find it later.

Nothing here syncs the device: `round_accepts` is a few tensor ops on the round's own tensors, `RoundTimer.done`
reads only events whose `query()` says they are complete.

TP > 1: every rank runs its own glue, and the ranks agree as long as their reports agree. The acceptances do
(every rank verifies the same trees); per-rank times do not, so the worker must report costs that are the same
on every rank (e.g. rank 0's, or a MAX all-reduce of the lagged event times done with the round's statistics),
or no cost at all (acceptances only: then the policy never measures a cost and keeps the configured tree).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ddtree.config import DDTreeConfig
from ddtree.policy import CHAIN, PolicyConfig, PolicyMode, Shape, ShapePolicy, candidate_shapes, format_policy_fields
from ddtree.sglang.batch_round import BatchCommit, BatchPlan


@dataclass(frozen=True)
class RoundShape:
    round_id: int
    shape: Shape
    probe: bool  # an exploration round: the bucket's current choice is another shape

    @property
    def is_chain(self) -> bool:
        return self.shape.is_chain

    @property
    def budget(self) -> int:
        """Tree nodes for `plan_batch` (0 for the chain)."""
        return self.shape.budget


@dataclass(frozen=True)
class RoundReport:
    """What one earlier round measured, once it reached the host: its acceptance (summed over its batch, bonus
    tokens included), its cost, or both; the two may come in separate reports."""

    round_id: int
    batch_size: int
    tree_accepted: int | None = None  # what the round committed (a chain round: DFLASH's accept lengths)
    spine_accepted: int | None = None  # what DFLASH's chain would have committed: the path's leading first-child
    #                                    nodes (a lower bound when it ended at a shallow leaf); = tree_accepted
    #                                    on a chain round
    smaller: Mapping[int, int] = field(default_factory=dict)  # budget -> what that smaller tree would have
    cost_ms: float | None = None  # the round's device time, the same on every TP rank


class PolicyGlue:
    """One per worker: the policy over the worker's candidates (the configured tree, two halvings, the chain)."""

    def __init__(self, config: DDTreeConfig, seed: int = 0) -> None:
        shapes = candidate_shapes(config.budget)
        pin = config.policy.pinned
        if pin is not None and pin not in shapes:
            shapes = (*shapes[:-1], pin, CHAIN)
        self.enabled = config.policy.mode is not PolicyMode.OFF
        self.policy = ShapePolicy(PolicyConfig(shapes=shapes, seed=seed), config.policy)
        self.configured = shapes[0]
        self._ran: dict[int, Shape] = {}

    def next_shape(self, batch_size: int, reports: Iterable[RoundReport] = ()) -> RoundShape:
        """The shape of this round; feeds `reports` (earlier rounds, in any order) to the policy first."""
        for report in reports:
            self._feed(report)
        if not self.enabled:
            return RoundShape(-1, self.configured, False)
        d = self.policy.decide(batch_size)
        self._ran[d.round_id] = d.shape
        while len(self._ran) > self.policy.config.max_pending:
            self._ran.pop(next(iter(self._ran)))
        return RoundShape(d.round_id, d.shape, d.probe)

    def _feed(self, r: RoundReport) -> None:
        ran = self._ran.get(r.round_id)
        if ran is None or r.batch_size < 1:
            return
        accepted: dict[Shape, float] | None = None
        if r.tree_accepted is not None or r.spine_accepted is not None:
            n, accepted = float(r.batch_size), {}
            if r.spine_accepted is not None:
                accepted[CHAIN] = r.spine_accepted / n
            if r.tree_accepted is not None:
                accepted[ran] = r.tree_accepted / n
            if not ran.is_chain:
                accepted.update({Shape(b): t / n for b, t in r.smaller.items() if 0 < b <= ran.budget})
        self.policy.observe(r.round_id, accepted=accepted, cost_ms=r.cost_ms)

    def log_fields(self) -> str:
        """The keys appended to the DDTREE metrics line (what MetricsLog(policy=glue.policy) appends)."""
        return format_policy_fields(self.policy.snapshot())


def round_accepts(plan: BatchPlan, commit: BatchCommit, budgets: Sequence[int], chain_depth: int) -> Tensor:
    """[bs, 2 + len(budgets)] int64 on the device, no sync: per request, what the round committed, what the chain
    would have (leading first-child slots of the path, capped at chain_depth), and what each smaller budget would
    have (path nodes with DDTree id <= budget: a best-first tree of budget b is the first b nodes of a larger one).
    Sum over the batch when the row reaches the host to build a `RoundReport`."""
    path = commit.path  # [bs, W] slots, -1 after tau
    on = path >= 0
    n = plan.num_nodes
    safe = path.clamp(0, n - 1)
    node = plan.order.gather(1, safe)  # [bs, W] DDTree ids (pop order)
    drafted = on[:, 1:]
    first_child = plan.retrieve_next_token.gather(1, safe[:, :-1])
    on_spine = (drafted & (safe[:, 1:] == first_child)).to(torch.int64)
    spine = 1 + torch.cumprod(on_spine, dim=1).sum(dim=1).clamp(max=chain_depth)
    cols = [commit.commit_lens.to(torch.int64), spine]
    cols += [1 + (drafted & (node[:, 1:] <= b)).sum(dim=1) for b in budgets]
    return torch.stack(cols, dim=1)


class RoundTimer:
    """Round times from CUDA events without host syncs: `start`/`stop` record events on the current stream,
    `done` returns the rounds whose end event has completed (query() is True), oldest first. On a CPU the
    host's clock stands in (immediately done)."""

    def __init__(self, device: torch.device, keep: int = 64) -> None:
        self.cuda = device.type == "cuda"
        self._open: Any = None
        self._pending: deque[tuple[int, Any, Any]] = deque(maxlen=keep)  # (round id, start, end)

    def start(self) -> None:
        if self.cuda:
            self._open = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._open.record()
        else:
            self._open = time.perf_counter()

    def stop(self, round_id: int) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end.record()
            self._pending.append((round_id, self._open, end))
        else:
            self._pending.append((round_id, self._open, time.perf_counter()))

    def done(self) -> list[tuple[int, float]]:
        out: list[tuple[int, float]] = []
        while self._pending:
            round_id, start, end = self._pending[0]
            if self.cuda and not end.query():
                break  # later rounds finish later on one stream
            self._pending.popleft()
            out.append((round_id, float(start.elapsed_time(end)) if self.cuda else (end - start) * 1e3))
        return out
