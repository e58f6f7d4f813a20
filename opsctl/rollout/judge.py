"""The rules of a rolling and a canary deploy behind a router, as pure functions of what the router and the
workers answered (`GET /workers`, the workers' and the router's `/metrics` scrapes, DDTREE metrics lines,
NRestarts), tested on recorded answers. Measuring lives in opsctl.rollout.canary; nothing here does I/O.

What clients saw comes from the router: sglang-router 0.3.2 counts each answer a worker gave it, per worker, as
a circuit-breaker outcome (`smg_worker_cb_outcomes_total{worker=<url>,outcome="success"|"failure"}`; every
non-2xx answer, a 400 included, and no answer at all are failures: tests/fixtures/router/metrics-0.3.2-*.txt,
recorded from the real router). A worker's own counters miss the requests it refuses (SGLang counts neither a
400 "longer than the model's context length" as a request nor as an abort), so a worker's refusals are the
router's failures beyond the worker's aborted requests, or, where the router does not say, the requests the
router sent beyond those the worker counted.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from opsctl import metrics, promtext
from opsctl.inventory.model import CanaryConfig
from opsctl.router.api import Member

SELFCHECK_FAILED = "DDTREE self-check FAILED"
TTFT = "sglang:time_to_first_token_seconds"
# SGLang 0.5.x's per-token decode latency; older SGLang (and vLLM-shaped exporters) call it time per output token
ITL = ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
# Rules whose failure rolls back at once, whatever the traffic: they are facts, not statistics
HARD_RULES = ("self-check failures", "restarts", "greedy replay", "refused")
# The router's per-worker counters, newest name first (sglang-router 0.3.x; the sgl_router_ names before it)
ROUTER_OUTCOMES = ("smg_worker_cb_outcomes_total", "sgl_router_cb_outcomes_total")
ROUTER_SENT = ("sgl_router_processed_requests_total",)
IN_FLIGHT = ("sglang:num_running_reqs", "sglang:num_queue_reqs")
# Refusals roll a canary back at once from this many on (and above the old group's rate + max_error_rate):
# fewer are judged with the error rate when the window closes
MIN_REFUSED = 5


class Decision(enum.Enum):
    PROMOTE = "promote"
    ROLL_BACK = "roll back"
    CONTINUE = "continue"  # the window is still open, or too little traffic so far and `max_window` not reached


def pick_canary(members: Sequence[Member], fronted: Sequence[str], n: int) -> tuple[tuple[str, ...], str]:
    """The first `n` fronted workers (inventory order) and "" ; or () and why no canary can start: every
    canary and at least one old worker must be listed by the router and healthy."""
    healthy = {m.url for m in members if m.healthy}
    missing = [u for u in fronted if u not in healthy]
    if missing:
        return (), f"{len(missing)} of the router's workers not healthy in it ({', '.join(missing[:3])})"
    if n >= len(fronted):
        return (), f"{n} canary worker(s) of {len(fronted)} would leave none on the old release"
    return tuple(fronted[:n]), ""


@dataclass(frozen=True)
class WorkerWindow:
    """One worker over the window: its /metrics at the start and the end, its journal's DDTREE lines,
    NRestarts at both ends, and the router's /metrics at both ends (None: no router read)."""

    url: str
    start: promtext.Scrape
    end: promtext.Scrape
    journal: tuple[str, ...]
    restarts_start: int
    restarts_end: int
    router_start: promtext.Scrape | None = None
    router_end: promtext.Scrape | None = None


@dataclass(frozen=True)
class GroupStats:
    workers: int
    requests: float  # as the workers counted them (their refusals left out)
    errors: float  # aborted requests
    ttft_p50: float | None
    ttft_p95: float | None
    itl_p50: float | None
    itl_p95: float | None
    tok_s: float | None  # mean of the DDTREE metrics lines' tok_s (None: no line, e.g. baseline mode)
    tau: float | None
    selfcheck_failures: int
    restarts: int
    unread: tuple[str, ...] = ()  # "url: why" for each worker whose /metrics could not be read at an end
    sent: float | None = None  # requests the router sent the group (None: the router's counters not read)
    refused: float = 0.0  # answered non-2xx (or not at all) beyond the aborted ones, as the router saw them
    router_unread: str = ""  # why the router's /metrics could not be read at an end ("": read, or not asked)

    @property
    def read(self) -> int:
        return self.workers - len(self.unread)

    @property
    def offered(self) -> float:
        """Requests the group had to answer: the router's count where read, never fewer than the workers'."""
        return max(self.requests, self.sent or 0.0, self.errors + self.refused)

    @property
    def error_rate(self) -> float:
        """Aborted and refused requests per request offered (what clients saw fail)."""
        return (self.errors + self.refused) / self.offered if self.offered else 0.0

    @property
    def refused_rate(self) -> float:
        return self.refused / self.offered if self.offered else 0.0


def _counter_delta(
    start: promtext.Scrape, end: promtext.Scrape, name: str, where: dict[str, str] | None = None
) -> float:
    late, early = end.total(name, where), start.total(name, where)
    if late is None:
        return 0.0
    return late if early is None or early > late else late - early  # a restart resets counters


def _delta(w: WorkerWindow, name: str) -> float:
    return _counter_delta(w.start, w.end, name)


def _in_flight(scrape: promtext.Scrape) -> float:
    return sum(scrape.total(name) or 0.0 for name in IN_FLIGHT)


def _router_unread(w: WorkerWindow) -> str:
    if w.router_start is None or w.router_end is None:
        return ""
    return w.router_start.error or w.router_end.error


def router_counts(w: WorkerWindow) -> tuple[float, float | None] | None:
    """(requests the router sent the worker, of which answered non-2xx or not at all: None where the router
    does not count them) over the window; None when the router was not read at both ends. A series the router
    never created is 0 (its exporter creates one at the first count)."""
    if w.router_start is None or w.router_end is None or _router_unread(w):
        return None
    worker = {"worker": w.url}
    for name in ROUTER_OUTCOMES:
        if w.router_end.total(name) is not None:
            ok = _counter_delta(w.router_start, w.router_end, name, {**worker, "outcome": "success"})
            failed = _counter_delta(w.router_start, w.router_end, name, {**worker, "outcome": "failure"})
            return ok + failed, failed
    for name in ROUTER_SENT:
        if w.router_end.total(name) is not None:
            return _counter_delta(w.router_start, w.router_end, name, worker), None
    return 0.0, 0.0


def refused(w: WorkerWindow) -> tuple[float | None, float]:
    """(sent, refused) of one worker: refused = the router's failures beyond the worker's aborted requests,
    or, where the router counts no failures, the requests sent beyond those the worker counted or holds."""
    counts = router_counts(w)
    if counts is None:
        return None, 0.0
    sent, failed = counts
    aborted = _delta(w, "sglang:num_aborted_requests_total")
    if failed is not None:
        return sent, max(0.0, failed - aborted)
    served = _delta(w, "sglang:num_requests_total")
    return sent, max(0.0, sent - served - max(0.0, _in_flight(w.end) - _in_flight(w.start)))


def _window_histogram(w: WorkerWindow, names: Sequence[str]) -> promtext.Histogram | None:
    """The first of `names` the worker exports, observed over its window."""
    for name in names:
        end = w.end.histogram(name)
        if end is not None:
            return end.minus(w.start.histogram(name))
    return None


def group_stats(windows: Sequence[WorkerWindow]) -> GroupStats:
    ttft: promtext.Histogram | None = None
    itl: promtext.Histogram | None = None
    tok_s: list[float] = []
    tau: list[float] = []
    failures = 0
    for w in windows:
        part = _window_histogram(w, (TTFT,))
        if part is not None:
            ttft = part if ttft is None else ttft.plus(part)
        part = _window_histogram(w, ITL)
        if part is not None:
            itl = part if itl is None else itl.plus(part)
        for record in metrics.parse_lines(w.journal):
            if isinstance(record, metrics.DDTreeMetrics) and record.rounds > 0:
                tok_s.append(record.tok_s)
                tau.append(record.tau)
        failures += sum(1 for line in w.journal if SELFCHECK_FAILED in line)

    def q(h: promtext.Histogram | None, p: float) -> float | None:
        return h.quantile(p) if h is not None else None

    counts = [refused(w) for w in windows]

    return GroupStats(
        workers=len(windows),
        requests=sum(_delta(w, "sglang:num_requests_total") for w in windows),
        errors=sum(_delta(w, "sglang:num_aborted_requests_total") for w in windows),
        ttft_p50=q(ttft, 0.5),
        ttft_p95=q(ttft, 0.95),
        itl_p50=q(itl, 0.5),
        itl_p95=q(itl, 0.95),
        tok_s=sum(tok_s) / len(tok_s) if tok_s else None,
        tau=sum(tau) / len(tau) if tau else None,
        selfcheck_failures=failures,
        restarts=sum(max(0, w.restarts_end - w.restarts_start) for w in windows),
        unread=tuple(f"{w.url}: {w.start.error or w.end.error}" for w in windows if w.start.error or w.end.error),
        sent=None if any(s is None for s, _ in counts) else sum(s or 0.0 for s, _ in counts),
        refused=sum(r for _, r in counts),
        router_unread=next((_router_unread(w) for w in windows if _router_unread(w)), ""),
    )


@dataclass(frozen=True)
class Replay:
    """Greedy requests replayed on a canary and an old worker: how many, how many gave identical tokens."""

    sent: int
    equal: int
    first_difference: str = ""  # "prompt <id> at token <i>", or the error that stopped the replay


@dataclass(frozen=True)
class Row:
    metric: str
    canary: str
    old: str
    rule: str
    ok: bool


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str  # the failed rules, "every rule passed", or why the window goes on
    rows: tuple[Row, ...]
    canary: GroupStats
    old: GroupStats
    replay: Replay | None
    elapsed: float | None = None  # seconds measured; None: the final look (the window is over)

    @property
    def promote(self) -> bool:
        return self.decision is Decision.PROMOTE


def _f(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}{unit}"


def _ratio_row(
    metric: str, canary: float | None, old: float | None, limit: float, upper: bool, unit: str, scale: float
) -> Row:
    """canary / old within `limit` (upper: at most; else at least). Unmeasured on either side: passes, shown."""
    shown = (_f(canary, unit, scale), _f(old, unit, scale))
    if canary is None or old is None or old <= 0:
        return Row(metric, *shown, f"{'<=' if upper else '>='} {limit:g}x (not measured)", True)
    ratio = canary / old
    ok = ratio <= limit if upper else ratio >= limit
    return Row(metric, *shown, f"{ratio:.2f}x {'<=' if upper else '>='} {limit:g}x", ok)


def _refused_row(canary: GroupStats, old: GroupStats, config: CanaryConfig) -> Row:
    """Requests the canary refused (non-2xx as the router saw them) that the old group would serve: at least
    MIN_REFUSED and a rate above the old group's + max_error_rate roll back at once."""

    def cell(g: GroupStats) -> str:
        return "-" if g.sent is None else f"{g.refused:.0f} ({g.refused_rate:.2%})"

    if canary.sent is None or old.sent is None:
        return Row("refused", cell(canary), cell(old), "router counters (not measured)", True)
    ok = canary.refused < MIN_REFUSED or canary.refused_rate <= old.refused_rate + config.max_error_rate
    return Row("refused", cell(canary), cell(old), f"< {MIN_REFUSED} or <= old + {config.max_error_rate:.2%}", ok)


def judge(
    canary: GroupStats, old: GroupStats, config: CanaryConfig, replay: Replay | None, elapsed: float | None = None
) -> Verdict:
    """The decision after `elapsed` seconds of the window (None: the last look, nothing may continue).

    A hard rule (self-check failures, restarts, the greedy replay) that fails rolls back at once. Otherwise the
    window goes on until `window`; then, with too little traffic in either group, until `max_window`, where
    too little traffic is no verdict and rolls back; with enough, every rule must hold to promote.
    """
    router_unread = canary.router_unread or old.router_unread
    rows = [
        Row(
            "metrics read",
            f"{canary.read}/{canary.workers}",
            f"{old.read}/{old.workers}",
            "every worker's /metrics" + (" and the router's" if router_unread else ""),
            not canary.unread and not old.unread and not router_unread,
        ),
        Row(
            "requests",
            f"{canary.offered:.0f}",
            f"{old.offered:.0f}",
            f">= {config.min_requests} each",
            canary.offered >= config.min_requests and old.offered >= config.min_requests,
        ),
        Row(
            "error rate",
            f"{canary.error_rate:.2%}",
            f"{old.error_rate:.2%}",
            f"<= old + {config.max_error_rate:.2%}",
            canary.error_rate <= old.error_rate + config.max_error_rate,
        ),
        _refused_row(canary, old, config),
        _ratio_row("TTFT p95", canary.ttft_p95, old.ttft_p95, config.max_ttft_ratio, True, " ms", 1000),
        _ratio_row("ITL p95", canary.itl_p95, old.itl_p95, config.max_itl_ratio, True, " ms", 1000),
        _ratio_row("tok/s", canary.tok_s, old.tok_s, config.min_tok_s_ratio, False, "", 1),
        _ratio_row("tau", canary.tau, old.tau, config.min_tau_ratio, False, "", 1),
        Row(
            "self-check failures",
            str(canary.selfcheck_failures),
            str(old.selfcheck_failures),
            f"<= {config.max_selfcheck_failures}",
            canary.selfcheck_failures <= config.max_selfcheck_failures,
        ),
        Row(
            "restarts",
            str(canary.restarts),
            str(old.restarts),
            f"<= {config.max_restarts}",
            canary.restarts <= config.max_restarts,
        ),
    ]
    rows[4:4] = [Row("TTFT p50", _f(canary.ttft_p50, " ms", 1000), _f(old.ttft_p50, " ms", 1000), "(shown)", True)]
    rows[6:6] = [Row("ITL p50", _f(canary.itl_p50, " ms", 1000), _f(old.itl_p50, " ms", 1000), "(shown)", True)]
    if replay is not None:
        rows.append(
            Row(
                "greedy replay",
                f"{replay.equal}/{replay.sent} equal",
                "reference",
                "all identical tokens",
                replay.sent > 0 and replay.equal == replay.sent,
            )
        )
    failed = [r for r in rows if not r.ok]
    reason = "; ".join(f"{r.metric} {r.canary} vs {r.old} (needs {r.rule})" for r in failed) or "every rule passed"
    if replay is not None and replay.first_difference and failed and failed[-1].metric == "greedy replay":
        reason += f": {replay.first_difference}"
    unread = [*canary.unread, *old.unread] + ([f"router /metrics: {router_unread}"] if router_unread else [])
    if unread:
        reason += f": {unread[0]}" + (f" (and {len(unread) - 1} more)" if len(unread) > 1 else "")
    hard = [r for r in failed if r.metric in HARD_RULES]
    short = not rows[0].ok or not rows[1].ok  # a worker unread or too few requests: no comparison yet
    until = math.inf if elapsed is None else elapsed
    if hard:
        decision = Decision.ROLL_BACK
        if until < config.window:  # the statistics are not judged yet: the reason is the hard rules alone
            reason = "; ".join(f"{r.metric} {r.canary} vs {r.old} (needs {r.rule})" for r in hard)
            if replay is not None and replay.first_difference and hard[-1].metric == "greedy replay":
                reason += f": {replay.first_difference}"
    elif until < config.window:
        decision, reason = Decision.CONTINUE, f"window open, {until:.0f}/{config.window:g}s"
    elif short and until < config.max_window:
        decision = Decision.CONTINUE
        if not rows[0].ok:
            reason = f"/metrics unread ({unread[0]})"
        else:
            reason = (
                f"too little traffic ({rows[1].canary} and {rows[1].old} requests, needs {config.min_requests} each)"
            )
        reason += f", measuring on up to {config.max_window:g}s ({until:.0f}s so far)"
    else:
        decision = Decision.ROLL_BACK if failed else Decision.PROMOTE
    return Verdict(decision, reason, tuple(rows), canary, old, replay, elapsed)


def table(verdict: Verdict) -> list[str]:
    """The comparison as aligned text lines, the verdict last."""
    header = ("metric", "canary", "old", "rule", "")
    body = [(r.metric, r.canary, r.old, r.rule, "ok" if r.ok else "FAIL") for r in verdict.rows]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in (header, *body)]
    lines.append(f"verdict: {verdict.decision.value.upper()} ({verdict.reason})")
    return lines
