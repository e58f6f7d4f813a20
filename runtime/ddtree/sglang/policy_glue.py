"""The SGLang tree worker's side of the shape policy (`ddtree.policy`), kept apart from the worker class.

Per greedy decode round the worker makes one call, before it drafts:

    shape = glue.next_shape(batch_size, ledger.due())

`ledger.due()` are the `RoundReport`s of the round `RoundLedger.lag` rounds back: its acceptance row
(`round_accepts`, summed over the batch on the device and copied to pinned host memory without blocking) and its
time between two CUDA events, both read once that round's end event is long complete (a fixed lag, so every TP
rank reads the same rounds at the same call). The answer is a `RoundShape`: run DFLASH's own chain round
(`is_chain`) or a tree round with `budget` nodes (<= the configured budget, so the verify window the worker
sized at start fits), and tag the round with `round_id` so its report can find it later.

Nothing here syncs the device inside a round: `round_accepts` is a few tensor ops on the round's own tensors,
`RoundLedger.close` enqueues a copy and an event, `RoundLedger.due` waits only on an event `lag` rounds old
(complete by then: the scheduler read that round's tokens).

TP > 1: every rank runs its own glue, and the ranks agree as long as their reports agree. The acceptances do
(every rank verifies the same trees); per-rank times do not, so the worker must report costs that are the same
on every rank (e.g. rank 0's, or a MAX all-reduce of the lagged event times done with the round's statistics),
or no cost at all (acceptances only: then the policy never measures a cost and keeps the configured tree). The
worker passes `RoundLedger` a `reduce_max` over its TP group's gloo group: the slowest rank's time, everywhere.

`DDTREE_TEST_POLICY=phased` (tests only, docs/metrics.md): the policy switches fast (dwell 1, a probe while any
shape is unmeasured, explore 0.25) on synthetic costs, the chain cheap for the first `PHASED_FLIP` rounds and
the trees after, so a short CPU run changes shape mid-request both ways; the acceptances stay the real ones.

`auto` runs `ddtree.policy.stable_config`: the worker seeds every shape's cost per batch bucket at start-up
(`PolicyGlue.seed_costs`, from timed replays once the graphs are captured), and the live rounds refine them
slowly. `DDTREE_RECORD_ROUNDS=<file>` (a benchmark hook, never rendered by opsctl) appends every report the policy
is fed to `<file>` as one JSON line (`RoundRecorder`), the input of `python -m ddtree.policy_sim record`
(docs/policy-rounds.md); record at TP 1 (every rank feeds the same reports).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ddtree.config import DDTreeConfig
from ddtree.policy import (
    CHAIN,
    PolicyConfig,
    PolicyMode,
    Shape,
    ShapePolicy,
    candidate_shapes,
    format_policy_fields,
    stable_config,
)
from ddtree.prom import default_sink
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
    gap_ms: float | None = None  # from this round's end to the next policy round's start (None: a forward of
    #                              another kind, a prefill, came between); the same on every TP rank


TEST_POLICY_KEY = "DDTREE_TEST_POLICY"
PHASED_FLIP = 3  # DDTREE_TEST_POLICY=phased: rounds (ids) during which the chain is the cheap shape


class RoundRecorder:
    """Appends each report the policy is fed, with the shape its round ran, as one JSON line (keys: round_id,
    batch_size, shape, tree_accepted, spine_accepted, smaller, cost_ms, gap_ms). `write` is the one side effect
    (a file's append by default; a list's append in tests)."""

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write

    @classmethod
    def to_file(cls, path: str) -> RoundRecorder:
        handle = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115  (open for the process's life)

        def write(line: str) -> None:
            handle.write(line + "\n")

        return cls(write)

    def record(self, ran: Shape, r: RoundReport) -> None:
        item = {
            "round_id": r.round_id,
            "batch_size": r.batch_size,
            "shape": ran.label,
            "tree_accepted": r.tree_accepted,
            "spine_accepted": r.spine_accepted,
            "smaller": {str(b): v for b, v in r.smaller.items()},
            "cost_ms": r.cost_ms,
            "gap_ms": r.gap_ms,
        }
        self.write(json.dumps(item, separators=(",", ":")))


class PolicyGlue:
    """One per worker: the policy over the worker's candidates (the configured tree, two halvings, the chain)."""

    def __init__(
        self, config: DDTreeConfig, seed: int = 0, test: str = "", recorder: RoundRecorder | None = None
    ) -> None:
        shapes = candidate_shapes(config.budget)
        pin = config.policy.pinned
        if pin is not None and pin not in shapes:
            shapes = (*shapes[:-1], pin, CHAIN)
        if test not in ("", "phased"):
            raise ValueError(f"{TEST_POLICY_KEY}={test!r}: expected phased (or unset)")
        self.phased = test == "phased"
        knobs: dict[str, Any] = {}
        if self.phased:
            knobs = {"dwell": 1, "first_dwell": 1, "warmup_every": 2, "explore": 0.25}
            knobs |= {"alpha_cost": 0.5, "alpha_accept": 0.5}
        self.enabled = config.policy.mode is not PolicyMode.OFF
        base = PolicyConfig(shapes=shapes, seed=seed, **knobs) if self.phased else stable_config(shapes, seed)
        self.policy = ShapePolicy(base, config.policy)
        self.recorder = recorder
        self.configured = shapes[0]
        self._ran: dict[int, Shape] = {}
        self._shown: dict[int, Shape] = {}  # bucket -> the current shape last reported by `switch_note`

    @property
    def runs_chain_rounds(self) -> bool:
        """Whether DFLASH's own chain rounds may run for the policy (auto, or pinned to the chain)."""
        pinned = self.policy.setting.pinned
        return self.enabled and (pinned is None or pinned.is_chain)

    @classmethod
    def from_config(cls, config: DDTreeConfig) -> PolicyGlue:
        """The worker's glue, with the configuration's test hooks (`test_policy`, `record_rounds`)."""
        recorder = RoundRecorder.to_file(config.record_rounds) if config.record_rounds else None
        return cls(config, test=config.test_policy, recorder=recorder)

    def seed_costs(
        self, time_round: Callable[[Shape, int], float], batch_sizes: Iterable[int], repeats: int = 5
    ) -> str:
        """Start-up costs: `time_round(shape, bs)` (ms of one replayed round of that shape at that batch size, on
        the device, e.g. CUDA events around the graphs' replays) `repeats` times per candidate and batch size; the
        median seeds the policy (`ShapePolicy.seed_cost`), the spread says how sure it is. Returns a log line
        (`startup costs bs 1: tree15 26.60 ms, ...`); "" when the policy is not `auto`."""
        if not self.enabled or self.policy.setting.mode is not PolicyMode.AUTO:
            return ""
        parts = []
        for bs in batch_sizes:
            cells = []
            for shape in self.policy.config.shapes:
                times = sorted(time_round(shape, bs) for _ in range(max(repeats, 1)))
                median = statistics.median(times)
                spread = statistics.stdev(times) if len(times) > 1 else 0.0
                self.policy.seed_cost(bs, shape, median, spread)
                cells.append(f"{shape.label} {median:.2f}")
            parts.append(f"bs {bs}: {', '.join(cells)}")
        return "startup costs (ms) " + "; ".join(parts)

    def smaller(self, shape: Shape) -> tuple[int, ...]:
        """The candidate budgets below a tree `shape`'s, whose acceptances its round also measures."""
        if shape.is_chain:
            return ()
        return tuple(s.budget for s in self.policy.config.shapes if not s.is_chain and s.budget < shape.budget)

    def switch_note(self, batch_size: int) -> str:
        """`batch 9-16: tree16 -> chain (tok/ms tree16 0.210, tree8 -, tree4 -, chain 0.390)` when the bucket of
        `batch_size` changed its current shape since the last call for it, else "" (the worker logs it: at most
        one line per bucket per `dwell` rounds)."""
        index = self.policy.bucket_of(batch_size)
        now = self.policy.current(batch_size)
        if now is None:
            return ""
        before = self._shown.setdefault(index, now if self.policy.setting.pinned else self.configured)
        if now == before:
            return ""
        self._shown[index] = now
        lo, hi = self.policy.bucket_range(index)
        span = f"{lo}-" if hi is None else (f"{lo}" if lo == hi else f"{lo}-{hi}")
        rates = []
        for s in self.policy.config.shapes:
            r = self.policy.estimate(batch_size, s)
            rates.append(f"{s.label} {'-' if r is None else f'{r:.3f}'}")
        return f"batch {span}: {before.label} -> {now.label} (tok/ms {', '.join(rates)})"

    def next_shape(self, batch_size: int, reports: Iterable[RoundReport] = ()) -> RoundShape:
        """The shape of this round; feeds `reports` (earlier rounds, in any order) to the policy first."""
        for report in reports:
            self._feed(report)
        if not self.enabled:
            return RoundShape(-1, self.configured, False)
        d = self.policy.decide(batch_size)
        sink = default_sink()
        if sink is not None:
            sink.decode_round("chain" if d.shape.is_chain else "tree")
        self._ran[d.round_id] = d.shape
        while len(self._ran) > self.policy.config.max_pending:
            self._ran.pop(next(iter(self._ran)))
        return RoundShape(d.round_id, d.shape, d.probe)

    def _feed(self, r: RoundReport) -> None:
        ran = self._ran.get(r.round_id)
        if ran is None or r.batch_size < 1:
            return
        if self.recorder is not None:
            self.recorder.record(ran, r)
        accepted: dict[Shape, float] | None = None
        if r.tree_accepted is not None or r.spine_accepted is not None:
            n, accepted = float(r.batch_size), {}
            if r.spine_accepted is not None:
                accepted[CHAIN] = r.spine_accepted / n
            if r.tree_accepted is not None:
                accepted[ran] = r.tree_accepted / n
            if not ran.is_chain:
                accepted.update({Shape(b): t / n for b, t in r.smaller.items() if 0 < b <= ran.budget})
        cost, gap = r.cost_ms, r.gap_ms
        if self.phased and cost is not None:  # DDTREE_TEST_POLICY=phased: synthetic costs, real acceptances
            cheap = ran.is_chain == (r.round_id < PHASED_FLIP)
            cost, gap = float(r.batch_size) * (1.0 if cheap else 40.0), None
        self.policy.observe(r.round_id, accepted=accepted, cost_ms=cost, gap_ms=gap)

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


@dataclass
class _Entry:
    round_id: int
    batch_size: int
    budgets: tuple[int, ...]  # the smaller budgets of the row, after (committed, chain)
    row: Tensor  # [2 + len(budgets)] int64 on the host (pinned on CUDA; filled when `end` completes)
    start: Any  # CUDA event, or the host clock
    end: Any
    next_start: Any = None  # the next policy round's start (None: not yet, or another forward came between)


class RoundLedger:
    """Each policy round's acceptance row and cost, read `lag` rounds later without a sync inside any round.

    `open()` before the round (a CUDA event), `close(...)` after it: the batch's `round_accepts` summed on the
    device and copied to pinned host memory (non-blocking), then the end event. `due()`, called before the next
    decision, returns the reports of the rounds at least `lag` rounds old: their end events are complete by then
    (the scheduler has read those rounds' tokens; `synchronize()` on such an event returns at once), so only
    host memory is read. `reduce_max` (TP > 1) replaces the due rounds' costs by their MAX over the ranks, in one
    call per `due()` (the ranks call it at the same rounds: a fixed lag, not `query()`). On a CPU the host's
    clock (`clock`, seconds) stands in for the events.

    Each report also carries the gap from its round's end event to the next policy round's start event: the
    scheduler's work on the round's output and the next batch, which the policy adds to the shape's cost.
    `interrupt()` (any forward that is not a policy round: a prefill, a DFLASH round for a sampling batch) leaves
    the last round's gap unknown rather than count that forward as its overhead. Gaps need `lag >= 2` (a round's
    report waits for the next round's start); with `lag == 1` they are None."""

    def __init__(
        self,
        device: torch.device,
        lag: int = 2,
        reduce_max: Callable[[Tensor], Tensor] | None = None,
        width: int = 8,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if lag < 1:
            raise ValueError("RoundLedger.lag must be >= 1")
        self.cuda = device.type == "cuda"
        self.lag, self.reduce_max, self.width, self.clock = lag, reduce_max, width, clock
        ring = lag + 2  # host rows in flight: `lag` closed rounds, the one being read, the one being written
        self._rows = torch.zeros((ring, width), dtype=torch.int64, pin_memory=self.cuda)
        self._next_row = 0
        self._open: Any = None
        self._last: _Entry | None = None  # the latest closed round, until the next round opens
        self._entries: deque[_Entry] = deque()
        self.reads = 0  # reports returned so far

    def interrupt(self) -> None:
        """A forward that is not a policy round ran: the latest round's gap is not measured."""
        self._last = None

    def open(self) -> None:
        if self.cuda:
            self._open = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._open.record()
        else:
            self._open = self.clock()
        if self._last is not None:  # no other forward since the latest round: its gap ends here
            self._last.next_start = self._open
            self._last = None

    def close(self, round_id: int, batch_size: int, accepts: Tensor, budgets: Sequence[int] = ()) -> None:
        """accepts: [bs, 2 + len(budgets)] (`round_accepts`, or a chain round's committed lengths twice)."""
        cols = 2 + len(budgets)
        if accepts.dim() != 2 or int(accepts.shape[1]) != cols or cols > self.width:
            raise ValueError(f"accepts must be [bs, {cols}] (<= {self.width} columns), got {tuple(accepts.shape)}")
        row = self._rows[self._next_row, :cols]
        self._next_row = (self._next_row + 1) % len(self._rows)
        row.copy_(accepts.sum(dim=0), non_blocking=self.cuda)  # on CUDA: enqueued before the end event
        if self.cuda:
            end: Any = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end.record()
        else:
            end = self.clock()
        self._entries.append(_Entry(round_id, batch_size, tuple(budgets), row, self._open, end))
        self._last = self._entries[-1]

    def due(self) -> list[RoundReport]:
        out: list[_Entry] = []
        while len(self._entries) >= self.lag:  # the newest lag - 1 rounds stay
            out.append(self._entries.popleft())
        if not out:
            return []
        costs, gaps = [], []
        for e in out:
            if self.cuda:
                e.end.synchronize()  # `lag` rounds old: complete already (and next_start, a round younger, too)
                costs.append(float(e.start.elapsed_time(e.end)))
                if e.next_start is not None:
                    e.next_start.synchronize()
                gaps.append(-1.0 if e.next_start is None else float(e.end.elapsed_time(e.next_start)))
            else:
                costs.append((e.end - e.start) * 1e3)
                gaps.append(-1.0 if e.next_start is None else (e.next_start - e.end) * 1e3)
        if self.reduce_max is not None:  # -1 (no gap) stays -1: the ranks interrupt at the same rounds
            both = self.reduce_max(torch.tensor(costs + gaps, dtype=torch.float64)).tolist()
            costs, gaps = both[: len(out)], both[len(out) :]
        reports = []
        for e, cost, gap in zip(out, costs, gaps, strict=True):
            vals = e.row.tolist()
            reports.append(
                RoundReport(
                    e.round_id,
                    e.batch_size,
                    tree_accepted=int(vals[0]),
                    spine_accepted=int(vals[1]),
                    smaller={b: int(v) for b, v in zip(e.budgets, vals[2:], strict=True)},
                    cost_ms=cost,
                    gap_ms=None if gap < 0 else gap,
                )
            )
        self.reads += len(reports)
        return reports
