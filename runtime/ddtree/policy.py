"""The round-shape policy: per batch-size bucket, choose the configured tree, a smaller budget or DFLASH's chain
from live acceptance and round costs (issue 29). Pure Python: no torch, no clock, no device.

Every round the engine asks `decide(batch_size)` for a `Decision` (a round id and the shape to run), and later
feeds what it measured with `observe(round_id, ...)`: the accepted tokens that shape and the shapes it dominates
would have committed (`counterfactual_accepts`) and the round's cost. Both may arrive late (a device reads its
CUDA events and statistics only when they are complete, never with a sync inside the round): observations are
matched to their round by id, and decisions use whatever has arrived.

Estimate of a shape in a bucket: accepted tokens per request-round (EWMA) / ms per request-round, i.e. the
batch's committed tokens per ms. The ms are the shape's round (EWMA) plus the shape's gap after its rounds, to
the next decode round's start (EWMA; the scheduler's work on the round's output and the next batch, which may
depend on the shape; a shape whose gap is not measured yet borrows the mean of the bucket's others). Without the
gap the cheaper round wins too often: on the H200's dense pair at batch 1, tree15's round was 4.87 ms of a
6.20 ms iteration and DFLASH's whole iteration 4.79 ms; on rounds alone the chain looked 7.6% better, counting
the gaps the two are even (measured: the tree 1.03x), and the policy had left the tree.
The bucket's current shape changes only when another shape's estimate beats it
by more than `margin`, not before the bucket's `first_dwell`-th round, and then at most once per `dwell` rounds
of that bucket (hysteresis). A seeded RNG picks a few
probe rounds (`explore`) that run another shape once, so its cost and acceptance stay fresh, and while a shape
has never been measured in a bucket every `warmup_every`-th round probes; probes do not change the current
shape.

Determinism: decisions are a function of the seed and the sequence of calls. At TP > 1 every rank makes its own
decisions and they agree as long as every rank feeds the same numbers: the acceptances are the same on every
rank (the same trees, the same verify), the costs must be too (rank 0's, or the max over ranks, shared).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

CHAIN_LABEL = "chain"
MIN_COST_MS = 1e-6  # below this a round time is not a measurement (and ms per request could underflow to 0)
DEFAULT_BUCKET_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # bucket i: batch sizes (edges[i-1], edges[i]]


class PolicyMode(StrEnum):
    OFF = "off"  # always the configured tree (the behaviour before the policy)
    AUTO = "auto"  # choose per bucket from the estimates
    PINNED = "pinned"  # always one shape (`chain` or `tree<N>`)


@dataclass(frozen=True, order=True)
class Shape:
    """What one round verifies: a best-first tree of `budget` nodes (the configured top-k), or (budget 0) the
    drafter's argmax chain of block_size - 1 nodes, DFLASH's own round."""

    budget: int  # 0: the chain

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0:
            raise ValueError(f"Shape.budget must be an int >= 0, got {self.budget!r}")

    @property
    def is_chain(self) -> bool:
        return self.budget == 0

    @property
    def label(self) -> str:
        return CHAIN_LABEL if self.is_chain else f"tree{self.budget}"

    @classmethod
    def parse(cls, text: str) -> Shape:
        """`chain` or `tree<N>` (N >= 1), as printed by `label`."""
        if text == CHAIN_LABEL:
            return CHAIN
        digits = text[4:] if text.startswith("tree") else ""
        if not digits.isascii() or not digits.isdigit() or digits.startswith("0"):
            raise ValueError(f"{text!r}: expected `chain` or `tree<N>` with N >= 1 (e.g. tree16)")
        return cls(int(digits))


CHAIN = Shape(0)


@dataclass(frozen=True)
class PolicySetting:
    """The `DDTREE_POLICY` / inventory `ddtree.policy` value: off, auto, or a pinned shape."""

    mode: PolicyMode = PolicyMode.OFF
    pinned: Shape | None = None

    @classmethod
    def parse(cls, text: str) -> PolicySetting:
        raw = text.strip().lower()
        if raw in (PolicyMode.OFF.value, PolicyMode.AUTO.value):
            return cls(PolicyMode(raw))
        try:
            return cls(PolicyMode.PINNED, Shape.parse(raw))
        except ValueError:
            raise ValueError(f"{text!r}: expected off, auto, chain or tree<N> (N >= 1)") from None

    @property
    def text(self) -> str:
        return self.pinned.label if self.pinned is not None else self.mode.value


def candidate_shapes(budget: int, smaller: int = 2) -> tuple[Shape, ...]:
    """The configured tree first, then `smaller` halvings of its budget (those >= 2), then the chain."""
    budgets = [budget]
    for _ in range(smaller):
        half = budgets[-1] // 2
        if half < 2:
            break
        budgets.append(half)
    return (*(Shape(b) for b in budgets), CHAIN)


def counterfactual_accepts(
    parents: Sequence[int], path: Sequence[int], ran: Shape, shapes: Sequence[Shape], chain_depth: int
) -> dict[Shape, int]:
    """Committed tokens (bonus included) each shape would have given this round, from the tree that ran.

    parents: the verified tree's parent array in pop order (node 0 the root); path: the accepted node ids, root
    first. A best-first tree of budget b is the first b nodes of a larger one (`ddtree.tree`: ids follow the
    pop order), so a smaller tree accepts the path's nodes with ids <= b: exact. The chain (the drafter's
    argmax chain, every node a first child) accepts the path's leading first-child nodes: exact when the walk
    rejected a first child, a lower bound when it ended at a leaf of the tree shallower than `chain_depth`
    (the chain might have gone on). Larger trees than the one that ran are unknown and left out.
    """
    first_child: dict[int, int] = {}
    for node in range(1, len(parents)):
        first_child.setdefault(parents[node], node)
    out: dict[Shape, int] = {}
    if ran.is_chain:
        if CHAIN in shapes:
            out[CHAIN] = len(path)
        return out
    drafted = path[1:]
    for shape in shapes:
        if shape.is_chain:
            spine = 0
            for node in drafted:
                if first_child.get(parents[node]) != node:
                    break
                spine += 1
            out[shape] = 1 + min(spine, chain_depth)
        elif shape.budget <= ran.budget:
            out[shape] = 1 + sum(1 for node in drafted if node <= shape.budget)  # ids grow along a path
    return out


@dataclass(frozen=True)
class PolicyConfig:
    shapes: tuple[Shape, ...]  # candidates; shapes[0] is the configured one (the start of every bucket)
    margin: float = 0.05  # switch only to a shape estimated > (1 + margin) x the current one
    dwell: int = 64  # rounds of a bucket between two switches of its current shape
    # rounds before a bucket's first switch: a bucket starts on the configured tree, and waiting a full dwell
    # there cost 5-18% of a 512-token batch on the H200 where the chain was better from the first round
    first_dwell: int = 8
    explore: float = 1 / 32  # probability that a round probes another shape
    warmup_every: int = 4  # while a candidate has no cost in a bucket, every Nth round of it probes
    alpha_accept: float = 0.05  # EWMA weight of one round's acceptance
    alpha_cost: float = 0.1  # EWMA weight of one round's cost
    seed: int = 0
    bucket_edges: tuple[int, ...] = DEFAULT_BUCKET_EDGES
    max_pending: int = 4096  # rounds awaiting observations; older ones are forgotten
    max_gap_ms: float = 100.0  # a longer pause between two decode rounds is the server idling, not overhead

    def __post_init__(self) -> None:
        if not self.shapes or len(set(self.shapes)) != len(self.shapes):
            raise ValueError("PolicyConfig.shapes must be non-empty and distinct")
        if not (self.margin >= 0 and self.dwell >= 1 and self.first_dwell >= 1 and self.warmup_every >= 1):
            raise ValueError("PolicyConfig: margin >= 0, dwell >= 1, first_dwell >= 1 and warmup_every >= 1")
        if not 0 <= self.explore < 1:
            raise ValueError("PolicyConfig: 0 <= explore < 1")
        if not (0 < self.alpha_accept <= 1 and 0 < self.alpha_cost <= 1):
            raise ValueError("PolicyConfig: alphas in (0, 1]")
        if not self.max_gap_ms > 0:
            raise ValueError("PolicyConfig: max_gap_ms > 0")
        edges = self.bucket_edges
        if not edges or edges[0] < 1 or any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError("PolicyConfig.bucket_edges must be increasing ints >= 1")


@dataclass(frozen=True)
class Decision:
    round_id: int
    shape: Shape  # what to run this round
    bucket: int  # index into the buckets (`bucket_range`)
    probe: bool  # an exploration round (the bucket's current shape is another)


@dataclass
class _Ewma:
    """An average that forgets by the bucket's rounds, not by samples: a sample after a gap of g rounds weighs
    1 - (1 - alpha)^g, so a shape measured again after a long absence is not judged by its old numbers."""

    alpha: float
    value: float | None = None
    at: int = 0  # the bucket's round of the latest sample

    def add(self, x: float, now: int) -> None:
        weight = 1.0 - (1.0 - self.alpha) ** max(now - self.at, 1)
        self.value = x if self.value is None else self.value + weight * (x - self.value)
        self.at = now


@dataclass
class _Bucket:
    current: Shape
    accept: dict[Shape, _Ewma]
    cost: dict[Shape, _Ewma]
    gap: dict[Shape, _Ewma]  # ms per request from a round of the shape's end to the next decode round's start
    rounds: int = 0
    last_switch: int = 0  # `rounds` when current last changed (0: start)
    switches: int = 0


@dataclass
class _Pending:
    bucket: int
    shape: Shape
    batch_size: int
    at: int  # the bucket's round it ran in
    accepted: bool = False
    costed: bool = False


@dataclass(frozen=True)
class BucketView:
    lo: int  # smallest batch size of the bucket
    hi: int | None  # largest (None: no upper bound)
    current: Shape
    estimates: dict[Shape, float | None]  # tokens per ms; None: not measured yet
    gap_ms: float | None  # the current shape's gap after its rounds, ms per request (None: not measured)
    rounds: int
    switches: int


@dataclass(frozen=True)
class PolicySnapshot:
    setting: PolicySetting
    buckets: tuple[BucketView, ...]  # buckets that decided at least one round, smallest batch first
    last: BucketView | None  # the bucket of the latest decision
    switches: int  # every bucket's, since start
    probes: int


@dataclass
class ShapePolicy:
    """Online shape choice; see the module docstring. Not thread-safe: one per worker (per TP rank)."""

    config: PolicyConfig
    setting: PolicySetting = field(default_factory=lambda: PolicySetting(PolicyMode.AUTO))

    def __post_init__(self) -> None:
        pin = self.setting.pinned
        if self.setting.mode is PolicyMode.PINNED and pin not in self.config.shapes:
            raise ValueError(f"pinned shape {pin.label if pin else None} is not a candidate")
        self._rng = random.Random(self.config.seed)
        self._buckets: dict[int, _Bucket] = {}
        self._pending: OrderedDict[int, _Pending] = OrderedDict()
        self._next_id = 0
        self._last_bucket: int | None = None
        self.probes = 0
        self.dropped = 0  # observations ignored: unknown (forgotten) round, or a non-finite / non-positive value

    # -- buckets --------------------------------------------------------------------------------------

    def bucket_of(self, batch_size: int) -> int:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        for i, edge in enumerate(self.config.bucket_edges):
            if batch_size <= edge:
                return i
        return len(self.config.bucket_edges)

    def bucket_range(self, index: int) -> tuple[int, int | None]:
        edges = self.config.bucket_edges
        lo = 1 if index == 0 else edges[index - 1] + 1
        return lo, edges[index] if index < len(edges) else None

    def _bucket(self, index: int) -> _Bucket:
        if index not in self._buckets:
            c = self.config
            start = self.setting.pinned if self.setting.pinned is not None else c.shapes[0]
            self._buckets[index] = _Bucket(
                current=start,
                accept={s: _Ewma(c.alpha_accept) for s in c.shapes},
                cost={s: _Ewma(c.alpha_cost) for s in c.shapes},
                gap={s: _Ewma(c.alpha_cost) for s in c.shapes},
            )
        return self._buckets[index]

    # -- estimates ------------------------------------------------------------------------------------

    @staticmethod
    def _gap(b: _Bucket, shape: Shape) -> float | None:
        """The shape's gap; unmeasured, the mean of the bucket's measured ones (None if there are none)."""
        own = b.gap[shape].value
        if own is not None:
            return own
        known = [e.value for e in b.gap.values() if e.value is not None]
        return sum(known) / len(known) if known else None

    @classmethod
    def _rate(cls, b: _Bucket, shape: Shape) -> float | None:
        acc, cost = b.accept[shape].value, b.cost[shape].value
        return None if acc is None or cost is None else acc / (cost + (cls._gap(b, shape) or 0.0))

    def current(self, batch_size: int) -> Shape | None:
        """The current (non-probe) shape of the bucket of `batch_size`; None before its first round."""
        b = self._buckets.get(self.bucket_of(batch_size))
        return None if b is None else b.current

    def estimate(self, batch_size: int, shape: Shape) -> float | None:
        """Tokens per ms of `shape` in the bucket of `batch_size`; None until measured."""
        b = self._buckets.get(self.bucket_of(batch_size))
        return None if b is None else self._rate(b, shape)

    # -- the decision ---------------------------------------------------------------------------------

    def decide(self, batch_size: int) -> Decision:
        index = self.bucket_of(batch_size)
        b = self._bucket(index)
        b.rounds += 1
        self._last_bucket = index
        shape, probe = b.current, False
        if self.setting.mode is PolicyMode.AUTO:
            self._maybe_switch(b)
            shape = b.current
            # one draw per round whatever the outcome, so the RNG stream depends only on the call sequence
            draw = self._rng.random() < self.config.explore
            warmup = b.rounds % self.config.warmup_every == 0 and any(e.value is None for e in b.cost.values())
            if (draw or warmup) and len(self.config.shapes) > 1:
                shape, probe = self._probe_target(b), True
                self.probes += 1
        elif self.setting.mode is PolicyMode.OFF:
            shape = self.config.shapes[0]
        decision = Decision(self._next_id, shape, index, probe)
        self._next_id += 1
        self._pending[decision.round_id] = _Pending(index, shape, batch_size, b.rounds)
        while len(self._pending) > self.config.max_pending:
            self._pending.popitem(last=False)
        return decision

    def _maybe_switch(self, b: _Bucket) -> None:
        wait = self.config.first_dwell if b.switches == 0 else self.config.dwell
        if b.rounds - b.last_switch < wait:
            return
        now = self._rate(b, b.current)
        rated = [(r, -i, s) for i, s in enumerate(self.config.shapes) if (r := self._rate(b, s)) is not None]
        if not rated:
            return
        best_rate, _, best = max(rated)  # ties: the earlier (larger) shape
        if now is not None and best != b.current and best_rate > now * (1 + self.config.margin):
            b.current, b.last_switch = best, b.rounds
            b.switches += 1

    def _probe_target(self, b: _Bucket) -> Shape:
        """The other shape whose cost was measured longest ago (never measured first; ties: the last candidate
        first, so the chain, the alternative that matters most, is measured first). Costs are only ever measured
        by running a shape; acceptances mostly come for free from the largest tree's rounds."""
        others = [s for s in self.config.shapes if s != b.current]
        order = self.config.shapes.index
        return min(others, key=lambda s: (b.cost[s].value is not None, b.cost[s].at, -order(s)))

    # -- observations ---------------------------------------------------------------------------------

    def observe(
        self,
        round_id: int,
        accepted: Mapping[Shape, float] | None = None,
        cost_ms: float | None = None,
        gap_ms: float | None = None,
    ) -> bool:
        """What round `round_id` measured, whenever it becomes known: `accepted` = mean committed tokens per
        request (bonus included) for the shapes known (`counterfactual_accepts`, averaged over the batch);
        `cost_ms` = the whole round's time; `gap_ms` (with the cost) = the time from this round's end to the next
        decode round's start (None when another kind of forward, a prefill, came between; over `max_gap_ms`:
        idle, ignored). Returns False if the round is unknown (too old) and was ignored."""
        pending = self._pending.get(round_id)
        if pending is None:
            self.dropped += 1
            return False
        b = self._buckets[pending.bucket]
        if accepted is not None and not pending.accepted:
            pending.accepted = True
            for shape, tau in accepted.items():
                if shape in b.accept and math.isfinite(tau) and tau >= 1.0:
                    b.accept[shape].add(float(tau), pending.at)
                else:
                    self.dropped += 1
        if cost_ms is not None and not pending.costed:
            pending.costed = True
            if math.isfinite(cost_ms) and cost_ms >= MIN_COST_MS:
                b.cost[pending.shape].add(cost_ms / pending.batch_size, pending.at)
            else:
                self.dropped += 1
            if gap_ms is not None and not (math.isfinite(gap_ms) and gap_ms >= 0):
                self.dropped += 1
            elif gap_ms is not None and gap_ms <= self.config.max_gap_ms:
                b.gap[pending.shape].add(gap_ms / pending.batch_size, pending.at)
        if pending.accepted and pending.costed:
            del self._pending[round_id]
        return True

    # -- visibility -----------------------------------------------------------------------------------

    def snapshot(self) -> PolicySnapshot:
        views = {i: self._view(i) for i in sorted(self._buckets)}
        return PolicySnapshot(
            setting=self.setting,
            buckets=tuple(views.values()),
            last=views.get(self._last_bucket) if self._last_bucket is not None else None,
            switches=sum(b.switches for b in self._buckets.values()),
            probes=self.probes,
        )

    def _view(self, index: int) -> BucketView:
        b = self._buckets[index]
        lo, hi = self.bucket_range(index)
        rates = {s: self._rate(b, s) for s in self.config.shapes}
        return BucketView(lo, hi, b.current, rates, self._gap(b, b.current), b.rounds, b.switches)


def _range_text(lo: int, hi: int | None) -> str:
    return f"{lo}-" if hi is None else f"{lo}-{hi}"


def format_policy_fields(snap: PolicySnapshot) -> str:
    """The keys appended to a `DDTREE metrics` line (docs/metrics.md): policy, shape, choice, est, switches,
    probes, gap. `choice` lists every bucket used so far as `lo-hi:shape` (`lo-` when open), `est` the latest
    decision's bucket, `shape:tokens_per_ms` (`-` until measured), `gap` that bucket's current shape's ms per
    request from its rounds' end to the next decode round (in its estimate's denominator)."""
    choice = ",".join(f"{_range_text(v.lo, v.hi)}:{v.current.label}" for v in snap.buckets) or "-"
    last = snap.last
    est = "-"
    if last is not None:
        est = ",".join(f"{s.label}:{'-' if r is None else f'{r:.3f}'}" for s, r in last.estimates.items())
    shape = last.current.label if last is not None else "-"
    return (
        f"policy={snap.setting.mode.value} shape={shape} choice={choice} est={est} "
        f"switches={snap.switches} probes={snap.probes} gap={_gap_text(last)}"
    )


def _gap_text(view: BucketView | None) -> str:
    return "-" if view is None or view.gap_ms is None else f"{view.gap_ms:.3f}"
