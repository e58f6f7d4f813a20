"""The round-shape policy: per batch-size bucket, choose the configured tree, a smaller budget or DFLASH's chain
from live acceptance and round costs. Pure Python: no torch, no clock, no device.

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

`stable_config` (what `auto` runs in the SGLang tree worker) adds to this: costs seeded per bucket at
start-up (`seed_cost`) or borrowed from the nearest bucket, averaged by samples rather than rounds; acceptance
pooled over the buckets with paired differences between shapes; and a switch only when the gain clears `margin`
plus `confidence` standard errors (`_gain_err`). The defaults of `PolicyConfig` keep the behaviour described
above (the reference engine's).

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
    # switch only when the estimated gain, log(best / current), exceeds margin + confidence x its standard error
    # (from the spread of the acceptances and costs behind the two estimates); 0: on the estimates alone
    confidence: float = 0.0
    # acceptance is a property of the text, not of the batch size: one average per shape over every bucket's
    # rounds (each request-round a sample), instead of one per bucket
    pool_accept: bool = False
    startup_samples: int = 32  # what a start-up cost (`seed_cost`) is worth, in live rounds
    min_accept_samples: int = 1  # no switch to or from a shape with fewer acceptance samples (a spread of 2 is luck)
    # True: an average forgets by the bucket's rounds (a sample after an absence of g rounds weighs
    # 1 - (1 - alpha)^g); False: by samples only (weight max(alpha, 1 / n)), so a shape that only probes measure,
    # one round in a few hundred, is not judged by its latest probe alone
    forget_by_rounds: bool = True
    # a bucket without start-up costs takes the nearest bucket's cost estimates as its seeds (scaled, like start-up
    # seeds, by what its own live rounds measure), instead of probing every shape in warm-up
    borrow_costs: bool = False

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
        if not (self.confidence >= 0 and self.startup_samples >= 1 and self.min_accept_samples >= 1):
            raise ValueError("PolicyConfig: confidence >= 0, startup_samples >= 1 and min_accept_samples >= 1")
        edges = self.bucket_edges
        if not edges or edges[0] < 1 or any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError("PolicyConfig.bucket_edges must be increasing ints >= 1")


def stable_config(shapes: tuple[Shape, ...], seed: int = 0) -> PolicyConfig:
    """The knobs `auto` runs with. Costs are seeded per bucket at start-up (`seed_cost`, scaled by
    what the live rounds measure) and averaged slowly, by samples; acceptance is pooled over the buckets and
    averaged over thousands of request-rounds, and two shapes are compared on their paired acceptances. A switch
    needs both shapes to have 512 acceptance samples and the gain to clear 1% plus twice its standard error; a
    bucket's first switch may come from its 4th round (a seeded bucket leaves a losing configured tree at once),
    later ones at most once per 256 of its rounds. One round in 64 probes another shape, never one that is
    surely worse. A bucket without start-up costs borrows the nearest bucket's. `python -m ddtree.policy_sim`
    replays recorded rounds through it (docs/policy-rounds.md)."""
    return PolicyConfig(
        shapes=shapes,
        seed=seed,
        margin=0.01,
        dwell=256,
        first_dwell=4,
        explore=1 / 64,
        warmup_every=4,
        alpha_accept=1 / 2048,
        alpha_cost=1 / 128,
        confidence=2.0,
        pool_accept=True,
        min_accept_samples=512,
        forget_by_rounds=False,
        borrow_costs=True,
    )


@dataclass(frozen=True)
class Decision:
    round_id: int
    shape: Shape  # what to run this round
    bucket: int  # index into the buckets (`bucket_range`)
    probe: bool  # an exploration round (the bucket's current shape is another)


@dataclass
class _Ewma:
    """A mean that forgets by the bucket's rounds, not by samples, and knows how sure it is.

    A sample after a gap of g rounds weighs max(1 - (1 - alpha)^g, 1 / n) (n: samples so far): the plain mean of
    the first 1 / alpha samples, then an exponential average; a shape measured again after a long absence is not
    judged by its old numbers. Beside the mean it keeps the samples' spread (`var`, weighted the same way) and
    the sum of the squared weights (`sq`), so the mean's standard error is sqrt(var * sq): 1 / sqrt(n) of the
    spread at first, sqrt(alpha / (2 - alpha)) of it in the long run, back near the spread itself after a long
    absence (one sample then weighs almost everything)."""

    alpha: float
    by_rounds: bool = True  # False: forget by samples (PolicyConfig.forget_by_rounds)
    value: float | None = None
    at: int = 0  # the round of the latest sample
    var: float = 0.0
    sq: float = 0.0
    n: int = 0

    def add(self, x: float, now: int) -> None:
        self.n += 1
        if self.value is None:
            self.value, self.var, self.sq, self.at = x, 0.0, 1.0, now
            return
        gap = max(now - self.at, 1) if self.by_rounds else 1
        weight = max(1.0 - (1.0 - self.alpha) ** gap, 1.0 / self.n)
        delta = x - self.value
        self.value += weight * delta
        self.var = (1.0 - weight) * (self.var + weight * delta * delta)
        self.sq = (1.0 - weight) ** 2 * self.sq + weight * weight
        self.at = now

    @property
    def rel_err(self) -> float:
        """The mean's standard error over the mean (inf before the first sample)."""
        if self.value is None or self.value <= 0:
            return math.inf
        return math.sqrt(max(self.var, 0.0) * self.sq) / self.value


@dataclass
class _Bucket:
    current: Shape
    accept: dict[Shape, _Ewma]
    cost: dict[Shape, _Ewma]
    gap: dict[Shape, _Ewma]  # ms per request from a round of the shape's end to the next decode round's start
    seed: dict[Shape, tuple[float, float]] = field(default_factory=dict)  # start-up ms per request, and spread
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
        # config.pool_accept: one acceptance average per shape over all buckets, timed by the round id
        self._pooled = {s: self._ewma(self.config.alpha_accept) for s in self.config.shapes}
        # with pool_accept: (earlier shape, later shape) -> the difference of their acceptances in one round
        self._diffs = {
            (a, c): self._ewma(self.config.alpha_accept) for a, c in itertools.combinations(self.config.shapes, 2)
        }
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

    def _ewma(self, alpha: float) -> _Ewma:
        return _Ewma(alpha, self.config.forget_by_rounds)

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
                accept={s: self._ewma(c.alpha_accept) for s in c.shapes},
                cost={s: self._ewma(c.alpha_cost) for s in c.shapes},
                gap={s: self._ewma(c.alpha_cost) for s in c.shapes},
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

    def _accepts(self, b: _Bucket) -> dict[Shape, _Ewma]:
        return self._pooled if self.config.pool_accept else b.accept

    def _seed_scale(self, b: _Bucket) -> tuple[float, float]:
        """Live over start-up cost in the bucket (a replay at start-up misses some of a live round's host work,
        the same for every shape), from the shapes measured both ways, weighted by their live samples; and its
        relative error. (1, 0) before any shape was measured live."""
        both = [(b.cost[s], ms) for s, (ms, _sd) in b.seed.items() if b.cost[s].value is not None]
        if not both:
            return 1.0, 0.0
        total = sum(e.n for e, _ in both)
        scale = sum(e.n * (e.value or 0.0) / ms for e, ms in both) / total
        return scale, min(e.rel_err for e, _ in both)

    def _cost(self, b: _Bucket, shape: Shape, scale_err: bool = True) -> tuple[float, float] | None:
        """A shape's round ms per request and its relative standard error. With a start-up seed, the live
        average and the seed (scaled by `_seed_scale`) are blended by the live samples: the seed weighs as
        `startup_samples` live rounds, so a shape that only probes measure keeps a steady estimate.
        `scale_err=False` leaves the scale's error out: it is common to every seeded shape of the bucket, so it
        cancels from their ratio (two shapes ranked by their start-up replays are as sure as the replays)."""
        live, seed = b.cost[shape], b.seed.get(shape)
        if seed is None:
            return None if live.value is None else (live.value, live.rel_err)
        k = self.config.startup_samples
        w = min(live.n, k) / k if live.value is not None else 0.0
        scale, s_err = self._seed_scale(b)
        seeded_err = math.hypot(s_err if scale_err else 0.0, seed[1] / seed[0] / math.sqrt(k))
        value = w * (live.value or 0.0) + (1 - w) * seed[0] * scale
        if w == 0:
            return value, seeded_err
        return value, math.hypot(w * live.rel_err, (1 - w) * seeded_err) if w < 1 else live.rel_err

    def _rate(self, b: _Bucket, shape: Shape) -> float | None:
        acc, cost = self._accepts(b)[shape].value, self._cost(b, shape)
        return None if acc is None or cost is None else acc / (cost[0] + (self._gap(b, shape) or 0.0))

    def _cost_err(self, b: _Bucket, shape: Shape, scale_err: bool = True) -> float:
        """The relative standard error of a shape's ms per request (a gap's error joins the round's in
        proportion)."""
        cost, gap = self._cost(b, shape, scale_err), b.gap[shape]
        if cost is None:
            return math.inf
        c = cost[0]
        g = self._gap(b, shape) or 0.0
        cost_se = math.hypot(cost[1] * c, gap.rel_err * g if gap.value is not None and g > 0 else 0.0)
        return cost_se / (c + g) if c + g > 0 else math.inf

    def _gain_err(self, b: _Bucket, best: Shape, now: Shape) -> float:
        """The standard error of log(rate(best) / rate(now)). The acceptance part comes from the two shapes'
        paired differences where one round measured both (counterfactuals: far tighter than two independent
        means, since the same text drives both), else from the two means as if independent."""
        acc = self._accepts(b)
        pair = self._diffs.get((best, now)) or self._diffs.get((now, best))
        ref = acc[now].value
        if pair is not None and pair.n >= self.config.min_accept_samples and ref:
            accept_err = math.sqrt(max(pair.var, 0.0) * pair.sq) / ref
        else:
            accept_err = math.hypot(acc[best].rel_err, acc[now].rel_err)
        common = best in b.seed and now in b.seed  # the seeds' common scale cancels from the ratio
        return math.hypot(accept_err, self._cost_err(b, best, not common), self._cost_err(b, now, not common))

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
            unmeasured = any(b.cost[s].value is None and s not in b.seed for s in self.config.shapes)
            if unmeasured and self.config.borrow_costs and not b.seed:
                unmeasured = not self._borrow(index)
            warmup = b.rounds % self.config.warmup_every == 0 and unmeasured
            target = self._probe_target(b) if (draw or warmup) and len(self.config.shapes) > 1 else None
            if target is not None:
                shape, probe = target, True
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
        if now is None or best == b.current or not best_rate > now * (1 + self.config.margin):
            return
        accepts = self._accepts(b)
        if min(accepts[best].n, accepts[b.current].n) < self.config.min_accept_samples:
            return
        if self.config.confidence > 0:
            err = self._gain_err(b, best, b.current)
            if not math.log(best_rate / now) > math.log1p(self.config.margin) + self.config.confidence * err:
                return
        b.current, b.last_switch = best, b.rounds
        b.switches += 1

    def _borrow(self, index: int) -> bool:
        """Seed bucket `index` from the nearest bucket with a cost estimate of every shape (per request, with a 10%
        spread); False if there is none yet."""
        b = self._buckets[index]
        for other in sorted(self._buckets, key=lambda i: (abs(i - index), i)):
            if other == index:
                continue
            costs = {s: self._cost(self._buckets[other], s) for s in self.config.shapes}
            if all(c is not None for c in costs.values()):
                b.seed = {s: (c[0], 0.1 * c[0]) for s, c in costs.items() if c is not None}
                return True
        return False

    def _probe_target(self, b: _Bucket) -> Shape | None:
        """The other shape whose cost was measured longest ago (never measured first; ties: the last candidate
        first, so the chain, the alternative that matters most, is measured first). Costs are only ever measured
        by running a shape; acceptances mostly come for free from the largest tree's rounds. With `confidence`,
        a shape whose estimate is below the current one's by more than `confidence` standard errors is not
        worth a probe (None: no shape is)."""
        others = [s for s in self.config.shapes if s != b.current]
        if self.config.confidence > 0:
            now = self._rate(b, b.current)
            if now is not None:
                z = self.config.confidence
                others = [
                    s
                    for s in others
                    if (r := self._rate(b, s)) is None or math.log(now / r) < z * self._gain_err(b, s, b.current)
                ]
        if not others:
            return None
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
            stats, at = (self._pooled, round_id) if self.config.pool_accept else (b.accept, pending.at)
            good = {}
            for shape, tau in accepted.items():
                if shape in stats and math.isfinite(tau) and tau >= 1.0:
                    stats[shape].add(float(tau), at)
                    good[shape] = float(tau)
                else:
                    self.dropped += 1
            if self.config.pool_accept:
                for (first, second), diff in self._diffs.items():
                    if first in good and second in good:
                        diff.add(good[first] - good[second], at)
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

    def seed_cost(self, batch_size: int, shape: Shape, cost_ms: float, spread_ms: float = 0.0) -> None:
        """A start-up measurement of `shape`'s round at `batch_size` (e.g. the median of its graph replays, and
        their spread), worth `startup_samples` live rounds of the bucket: the bucket starts with every shape's
        cost known, so it needs no warm-up probes, and the live rounds refine the cost slowly. A bucket seeded
        from several batch sizes keeps the latest seed (seed each bucket's typical size, e.g. its upper edge)."""
        if shape not in self.config.shapes:
            raise ValueError(f"seed_cost: {shape.label} is not a candidate")
        if not (math.isfinite(cost_ms) and cost_ms >= MIN_COST_MS and math.isfinite(spread_ms) and spread_ms >= 0):
            raise ValueError(f"seed_cost: cost {cost_ms!r} ms, spread {spread_ms!r} ms")
        self._bucket(self.bucket_of(batch_size)).seed[shape] = (cost_ms / batch_size, spread_ms / batch_size)

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
