"""Per-round statistics and the DDTREE log lines (the contract `opsctl logs --metrics` parses).

Lines go through `logging.getLogger("ddtree")` at INFO. `key=value` pairs, space separated; keys are stable
(new keys may be appended, none renamed); ints print as ints, floats with exactly 3 decimals.
See docs/metrics.md for every key.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ddtree import __version__
from ddtree.config import DDTreeConfig, HybridMode
from ddtree.policy import ShapePolicy, format_policy_fields
from ddtree.prom import DDTreeProm, default_sink
from ddtree.stats import RoundStats

LOGGER_NAME = "ddtree"
FLOAT_DECIMALS = 3


@dataclass(frozen=True)
class MetricsSummary:
    rounds: int  # cumulative since start
    tokens: int  # cumulative committed tokens since start
    tau: float  # the rest: means over the window (rounds since the previous metrics line)
    nodes: float
    depth: float
    off_spine: float  # fraction of the window's rounds
    draft_ms: float
    build_ms: float
    verify_ms: float
    commit_ms: float
    tok_s: float  # window tokens / window (draft + build + verify + commit) time
    width: float


def _fmt(value: float) -> str:
    return f"{value:.{FLOAT_DECIMALS}f}"


def format_init(config: DDTreeConfig, block_size: int, hybrid: HybridMode) -> str:
    return (
        f"DDTREE init mode={config.verify.value} budget={config.budget} topk={config.topk} "
        f"block={block_size} hybrid={hybrid.value} log_interval={config.log_interval} version={__version__}"
    )


def format_verify_completed(stats: RoundStats) -> str:
    return f"DDTREE verify completed accept_length={stats.accepted_len} nodes={stats.nodes}"


def format_metrics(summary: MetricsSummary, hybrid: HybridMode, policy: ShapePolicy | None = None) -> str:
    """The metrics line; `policy` (when the shape policy runs) appends its keys after every other one."""
    s = summary
    line = (
        f"DDTREE metrics rounds={s.rounds} tokens={s.tokens} tau={_fmt(s.tau)} nodes={_fmt(s.nodes)} "
        f"depth={_fmt(s.depth)} off_spine={_fmt(s.off_spine)} draft_ms={_fmt(s.draft_ms)} "
        f"build_ms={_fmt(s.build_ms)} verify_ms={_fmt(s.verify_ms)} commit_ms={_fmt(s.commit_ms)} "
        f"tok_s={_fmt(s.tok_s)} width={_fmt(s.width)}"
    )
    if hybrid is HybridMode.UNSAFE:
        line += " hybrid=unsafe"
    return line + " " + format_policy_fields(policy.snapshot()) if policy is not None else line


def summarize(window: Sequence[RoundStats], rounds_total: int, tokens_total: int) -> MetricsSummary:
    """Means over a non-empty window of rounds, with the cumulative counters."""
    if not window:
        raise ValueError("summarize needs at least one round")
    n = len(window)
    tokens = sum(r.accepted_len for r in window)
    busy_ms = sum(r.draft_ms + r.build_ms + r.verify_ms + r.commit_ms for r in window)
    return MetricsSummary(
        rounds=rounds_total,
        tokens=tokens_total,
        tau=tokens / n,
        nodes=sum(r.nodes for r in window) / n,
        depth=sum(r.depth for r in window) / n,
        off_spine=sum(r.off_spine for r in window) / n,
        draft_ms=sum(r.draft_ms for r in window) / n,
        build_ms=sum(r.build_ms for r in window) / n,
        verify_ms=sum(r.verify_ms for r in window) / n,
        commit_ms=sum(r.commit_ms for r in window) / n,
        tok_s=tokens * 1000.0 / busy_ms if busy_ms > 0 else 0.0,
        width=sum(r.width for r in window) / n,
    )


class MetricsLog:
    """Collects RoundStats and emits the DDTREE lines: init (on `start`), verify completed (after the first
    round), metrics (every `config.log_interval` rounds, and on `flush` for a partial window).

    `prom` (default: the process's, `ddtree.prom.default_sink`; None exports nothing) gets each metrics line's
    window of rounds and the policy's state as the line is written: the `ddtree_*` Prometheus series count what
    the lines do, and move when they do."""

    def __init__(
        self,
        config: DDTreeConfig,
        block_size: int,
        hybrid: HybridMode | str,
        logger: logging.Logger | None = None,
        policy: ShapePolicy | None = None,
        prom: DDTreeProm | None = None,
    ) -> None:
        self.config = config
        self.prom = prom if prom is not None else default_sink()
        self.policy = policy  # its choice and estimates are appended to every metrics line
        self.block_size = block_size
        self.hybrid = HybridMode(hybrid)
        self.logger = logger if logger is not None else logging.getLogger(LOGGER_NAME)
        self.rounds = 0
        self.tokens = 0
        self._window: list[RoundStats] = []

    def _emit(self, line: str) -> str:
        self.logger.info(line)
        return line

    def start(self) -> str:
        return self._emit(format_init(self.config, self.block_size, self.hybrid))

    def record(self, stats: RoundStats) -> list[str]:
        """Add one round; returns the lines it emitted."""
        self.rounds += 1
        self.tokens += stats.accepted_len
        self._window.append(stats)
        lines = []
        if self.rounds == 1:
            lines.append(self._emit(format_verify_completed(stats)))
        if len(self._window) >= self.config.log_interval:
            lines.append(self._flush_window())
        return lines

    def records_until_line(self) -> int:
        """How many more `record` calls until one emits a line (verify completed or metrics), >= 1."""
        if self.rounds == 0:
            return 1
        return max(self.config.log_interval - len(self._window), 1)

    def flush(self) -> str | None:
        """Emit a metrics line for the rounds since the last one, if any (e.g. at shutdown)."""
        return self._flush_window() if self._window else None

    def _flush_window(self) -> str:
        summary = summarize(self._window, self.rounds, self.tokens)
        if self.prom is not None:
            self.prom.observe_window(self._window)
            if self.policy is not None:
                self.prom.policy(self.policy.snapshot())
        self._window = []
        return self._emit(format_metrics(summary, self.hybrid, self.policy))
