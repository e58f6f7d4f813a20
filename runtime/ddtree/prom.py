"""DDTREE statistics as Prometheus metrics (`ddtree_*`), fed where the DDTREE log lines are made.

`MetricsLog` (ddtree.metrics) hands every round it records to its `prom` sink, a `DDTreeProm`, so the counters
and histograms here hold the same numbers as the `DDTREE metrics` lines over the same rounds:
`ddtree_rounds_total` is the line's `rounds`, `ddtree_committed_tokens_total` its `tokens`, a histogram's
`_sum / _count` over a window is the line's mean (`tau`, `nodes`, `depth`, `width`), and
`ddtree_committed_tokens_total / sum(ddtree_phase_seconds_total)` its `tok_s`. docs/monitoring.md lists
every series.

Where the sink comes from:
- the reference server (`ddtree.serve`) builds one on its own registry, beside its `sglang:*` series;
- under SGLang, the plugin installs `ddtree.sglang.prom_glue.sglang_sink` as the process's default factory;
  it returns a sink only when SGLang runs prometheus_client in multiprocess mode (`--enable-metrics` sets
  PROMETHEUS_MULTIPROC_DIR before the scheduler starts), and only on tensor-parallel rank 0, the rank that
  writes the DDTREE lines. Its values go to the multiprocess directory's files, which SGLang's `/metrics`
  collects: counters and histograms add up over processes, gauges show the most recent value (SGLang's own
  `mostrecent` mode).

Labels: `model_name` on every series (SGLang's label), plus `phase`, `kind`, `reason` or `bucket` where named;
none per request. A restart starts every counter at 0, as Prometheus expects.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from ddtree.stats import PHASES, RoundStats

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ddtree.policy import PolicySnapshot

# A decode round's `kind` says which verify made its tokens, in every mode: `tree` (the whole tree in one forward),
# `chain` (the shape policy chose DFLASH's chain) or `dflash` (DFLASH's chain verify for another reason: `reason`).
RoundKind = Literal["tree", "chain", "dflash"]
RoundLabels = tuple[RoundKind, str]  # (kind, reason); reason "" but for `dflash`
# Why a decode round ran DFLASH's chain verify instead of a tree: the label value by the start of the worker's
# reason text (ddtree.sglang.request_kinds.dflash_round_reason; "self-check" after a failed self-check; "shadow"
# for every decode round of a shadow service, which verifies the spine and builds its trees only to report them)
DFLASH_REASONS: dict[str, str] = {
    "shadow": "shadow",
    "sampling": "sampling",
    "grammar": "grammar",
    "log-prob": "logprob",
    "custom logit": "logit_processor",
    "penalties": "penalties",
    "self-check": "selfcheck",
}
ACCEPT_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0)
NODE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
DEPTH_BUCKETS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)
WIDTH_BUCKETS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0)


class DDTreeProm:
    """The `ddtree_*` series of one engine process, every child created up front (so each series exists from
    the start, at 0). Not thread-safe beyond prometheus_client's own locks: one writer, the engine's loop."""

    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        kind_of_round: Callable[[RoundStats], RoundLabels] | None = None,
    ) -> None:
        """`kind_of_round`: an engine whose every recorded round is one decode round (the reference engine,
        batch 1) counts `ddtree_decode_rounds_total` in `observe`, with the (kind, reason) this gives the round;
        SGLang's workers count their batches themselves (`decode_round`)."""
        # imported here: prometheus_client picks its multiprocess value class at import, from the environment
        # SGLang sets up before the scheduler starts; and the runtime's core needs no prometheus_client
        from prometheus_client import Counter, Gauge, Histogram

        names = ["model_name"]
        self.model_name = model_name

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return Counter(name, doc, [*names, *extra], registry=registry)

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return Gauge(name, doc, [*names, *extra], registry=registry, multiprocess_mode="mostrecent")

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, names, registry=registry, buckets=buckets).labels(model_name)

        m = model_name
        self._rounds = counter("ddtree_rounds", "DDTREE request-rounds recorded (the metrics line's rounds).").labels(m)
        self._tokens = counter(
            "ddtree_committed_tokens", "Tokens committed by DDTREE rounds, bonus tokens included (tokens)."
        ).labels(m)
        self._off_spine = counter(
            "ddtree_off_spine_rounds", "Request-rounds whose accepted path left the drafter's argmax chain."
        ).labels(m)
        phase = counter("ddtree_phase_seconds", "Time in each phase of the DDTREE rounds.", ("phase",))
        self._phase = {p: phase.labels(m, p) for p in PHASES}
        self._accept = histogram(
            "ddtree_accept_length", "Tokens committed per request-round, bonus included (tau).", ACCEPT_BUCKETS
        )
        self._nodes = histogram(
            "ddtree_tree_nodes", "Drafted tree nodes per request-round, root excluded.", NODE_BUCKETS
        )
        self._depth = histogram("ddtree_tree_depth", "Deepest drafted node per request-round.", DEPTH_BUCKETS)
        self._width = histogram("ddtree_tree_width", "Most nodes at one depth per request-round.", WIDTH_BUCKETS)
        kinds = counter(
            "ddtree_decode_rounds",
            "Decode rounds (batches) by the verify that made their tokens: tree, chain (the policy's), dflash "
            "(DFLASH's chain verify; reason: shadow, or why a tree round could not run).",
            ("kind", "reason"),
        )
        self._kinds: dict[tuple[str, str], Any] = {("tree", ""): kinds.labels(m, "tree", "")}
        self._kinds[("chain", "")] = kinds.labels(m, "chain", "")
        for reason in (*DFLASH_REASONS.values(), "other"):
            self._kinds[("dflash", reason)] = kinds.labels(m, "dflash", reason)
        self._selfcheck_failed = gauge(
            "ddtree_selfcheck_failed", "1 once a self-check found the tree verify differs from the chain's."
        ).labels(m)
        self._selfcheck_failed.set(0)
        self._shape = gauge(
            "ddtree_policy_shape_budget",
            "The shape policy's current shape per batch-size bucket: tree nodes, 0 for the chain.",
            ("bucket",),
        )
        self._switches = counter("ddtree_policy_switches", "Shape changes of the policy, any bucket.").labels(m)
        self._probes = counter("ddtree_policy_probes", "Exploration rounds run by the policy.").labels(m)
        self._kind_of_round = kind_of_round
        self._seen_switches = 0
        self._seen_probes = 0

    def observe_window(self, window: Sequence[RoundStats]) -> None:
        """The request-rounds of one metrics line's window, as `MetricsLog` writes the line: every series moves
        once per line (a few updates per window, not per round: under SGLang each update is a write to a
        multiprocess file)."""
        if not window:
            return
        self._rounds.inc(len(window))
        self._tokens.inc(sum(r.accepted_len for r in window))
        off = sum(1 for r in window if r.off_spine)
        if off:
            self._off_spine.inc(off)
        for name, ms in zip(PHASES, _phase_sums(window), strict=True):
            if ms > 0:
                self._phase[name].inc(ms / 1000.0)
        observe_counts(self._accept, Counter(r.accepted_len for r in window))
        observe_counts(self._nodes, Counter(r.nodes for r in window))
        observe_counts(self._depth, Counter(r.depth for r in window))
        observe_counts(self._width, Counter(r.width for r in window if r.width > 0))
        if self._kind_of_round is not None:
            for labels, n in Counter(self._kind_of_round(r) for r in window).items():
                self._kinds[labels].inc(n)

    def decode_round(self, kind: RoundKind, why: str = "") -> None:
        """One decode round (a batch) of `kind`; `why` (a `dflash` round's) is the worker's reason text, mapped
        to a label value by `dflash_reason`."""
        reason = "" if kind != "dflash" else dflash_reason(why)
        self._kinds[(kind, reason)].inc()

    def self_check_failed(self) -> None:
        self._selfcheck_failed.set(1)

    def policy(self, snap: PolicySnapshot) -> None:
        """The policy's state when a metrics line is written: shapes per bucket, switches and probes (the
        snapshot's counts are cumulative; the counters advance by the difference)."""
        for view in snap.buckets:
            bucket = f"{view.lo}-" if view.hi is None else f"{view.lo}-{view.hi}"
            self._shape.labels(self.model_name, bucket).set(view.current.budget)
        if snap.switches > self._seen_switches:
            self._switches.inc(snap.switches - self._seen_switches)
            self._seen_switches = snap.switches
        if snap.probes > self._seen_probes:
            self._probes.inc(snap.probes - self._seen_probes)
            self._seen_probes = snap.probes


def dflash_reason(why: str) -> str:
    """The `reason` label of a DFLASH round: DFLASH_REASONS' value for the text's start, else `other`."""
    return next((label for start, label in DFLASH_REASONS.items() if why.startswith(start)), "other")


def _phase_sums(window: Sequence[RoundStats]) -> tuple[float, float, float, float]:
    return (
        sum(r.draft_ms for r in window),
        sum(r.build_ms for r in window),
        sum(r.verify_ms for r in window),
        sum(r.commit_ms for r in window),
    )


def observe_counts(child: Any, counts: Mapping[int, int]) -> None:
    """`child.observe(value)` `n` times for each value: n; in one update of its sum and one of the value's
    bucket (prometheus_client's Histogram child: `_sum`, `_buckets` per upper bound, non-cumulative, as its
    `observe` keeps them), else through `observe`."""
    buckets, bounds = getattr(child, "_buckets", None), getattr(child, "_upper_bounds", None)
    total = getattr(child, "_sum", None)
    if buckets is None or bounds is None or total is None or len(buckets) != len(bounds):
        for value, n in counts.items():
            for _ in range(n):
                child.observe(value)
        return
    for value, n in counts.items():
        total.inc(value * n)
        buckets[bisect.bisect_left(bounds, value)].inc(n)


# The process's default sink: a factory installed once at start-up (the SGLang plugin), called once.
_factory: Callable[[], DDTreeProm | None] | None = None
_made: list[DDTreeProm | None] = []


def install_default(factory: Callable[[], DDTreeProm | None]) -> None:
    """Set the factory `default_sink` calls (once, the first time a sink is asked for)."""
    global _factory
    if factory is not _factory:  # the same factory again (a repeated plugin registration) keeps its sink
        _factory = factory
        _made.clear()


def default_sink() -> DDTreeProm | None:
    """This process's sink: the installed factory's, made on first use; None without a factory."""
    if not _made:
        _made.append(_factory() if _factory is not None else None)
    return _made[0]
