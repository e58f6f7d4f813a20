"""The rules of a deploy behind a router as pure functions of recorded answers: who may leave the router,
which workers form the canary, each group's numbers over a window, and the verdict with its table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from opsctl import promtext
from opsctl.inventory.model import CanaryConfig
from opsctl.rollout.judge import (
    Decision,
    GroupStats,
    Replay,
    WorkerWindow,
    group_stats,
    judge,
    pick_canary,
    table,
)
from opsctl.router.api import parse_members
from opsctl.router.keptout import refuse_take_out

FIXTURES = Path(__file__).parents[1] / "fixtures"
CONTRACT = (FIXTURES / "logs" / "ddtree_contract.log").read_text().splitlines()
A, B = "http://10.0.0.1:30000", "http://10.0.0.2:30000"


def workers(*entries: tuple[str, bool]) -> object:
    """A `GET /workers` answer of sglang-router 0.3.2 (the shape tests/lab/test_router.py reads)."""
    return {
        "workers": [
            {"id": f"id-{i}", "url": url, "model_id": "m", "worker_type": "regular", "is_healthy": ok, "load": 0}
            for i, (url, ok) in enumerate(entries)
        ],
        "total": len(entries),
    }


def test_the_last_healthy_worker_never_leaves() -> None:
    assert refuse_take_out(parse_members(workers((A, True), (B, True))), A) is None
    assert refuse_take_out(parse_members(workers((A, True), (B, False))), A) == f"{A} healthy, {B} unhealthy"
    # a worker that serves nothing may always leave: the deploy that heals an all-down router goes ahead
    assert refuse_take_out(parse_members(workers()), A) is None
    assert refuse_take_out(parse_members(workers((A, False), (B, False))), A) is None
    assert refuse_take_out(parse_members(workers((B, True))), A) is None
    assert refuse_take_out(parse_members(workers((A, True))), A) == f"{A} healthy"


def test_canary_needs_every_worker_healthy_and_one_left_on_the_old_release() -> None:
    members = parse_members(workers((A, True), (B, True)))
    assert pick_canary(members, [A, B], 1) == ((A,), "")
    assert pick_canary(members, [A, B], 2)[1] == "2 canary worker(s) of 2 would leave none on the old release"
    assert pick_canary(parse_members(workers((A, True))), [A, B], 1)[1].startswith("1 of the router's workers not")


def scrape(requests: float, aborted: float, itl: tuple[float, float, float]) -> promtext.Scrape:
    """A reference server's /metrics (names and labels as tests/fixtures/metrics/reference-*.txt)."""
    m = 'model_name="/dev/shm/tiny-qwen3"'
    low, mid, inf = itl
    return promtext.parse(
        f"sglang:num_requests_total{{{m}}} {requests}\n"
        f"sglang:num_aborted_requests_total{{{m}}} {aborted}\n"
        f'sglang:inter_token_latency_seconds_bucket{{le="0.01",{m}}} {low}\n'
        f'sglang:inter_token_latency_seconds_bucket{{le="0.06",{m}}} {mid}\n'
        f'sglang:inter_token_latency_seconds_bucket{{le="+Inf",{m}}} {inf}\n'
        f"sglang:inter_token_latency_seconds_count{{{m}}} {inf}\n"
    )


def test_group_stats_from_two_scrapes_journal_lines_and_restarts() -> None:
    window = WorkerWindow(
        A, scrape(10, 0, (5, 10, 10)), scrape(40, 1, (80, 100, 100)), tuple(CONTRACT), restarts_start=2,
        restarts_end=3,
    )  # fmt: skip
    stats = group_stats([window])
    assert (stats.requests, stats.errors, stats.restarts) == (30, 1, 1)
    assert stats.itl_p50 is not None and stats.itl_p50 < 0.01  # 75 of the 90 new observations under 10 ms
    assert stats.tau is not None and 3.2 < stats.tau < 3.4  # the contract log's two metrics lines: 3.22, 3.36
    assert stats.tok_s is not None and 118 < stats.tok_s < 121
    assert stats.ttft_p95 is None  # not exported by this scrape: not measured


OLD = GroupStats(1, 100, 0, 0.05, 0.08, 0.006, 0.009, 100.0, 2.0, 0, 0)
CONFIG = CanaryConfig(min_requests=20)


def test_a_good_canary_is_promoted() -> None:
    good = replace(OLD, requests=90, ttft_p95=0.085, itl_p95=0.008, tok_s=140.0, tau=3.1)
    verdict = judge(good, OLD, CONFIG, Replay(3, 3))
    assert verdict.promote and verdict.reason == "every rule passed"
    lines = table(verdict)
    assert lines[0].split() == ["metric", "canary", "old", "rule"]
    assert any(line.startswith("tok/s") and "1.40x >= 0.8x" in line for line in lines)
    assert lines[-1] == "verdict: PROMOTE (every rule passed)"


def test_a_slow_canary_is_rolled_back_and_the_table_says_why() -> None:
    slow = replace(OLD, itl_p95=0.055, ttft_p95=0.2)
    verdict = judge(slow, OLD, CONFIG, None)
    assert not verdict.promote
    assert verdict.reason.startswith("TTFT p95 200.0 ms vs 80.0 ms (needs 2.50x <= 1.5x)")
    assert "ITL p95 55.0 ms vs 9.0 ms (needs 6.11x <= 1.5x)" in verdict.reason
    failed = [line for line in table(verdict) if line.endswith("FAIL")]
    assert [line.split()[0] for line in failed] == ["TTFT", "ITL"]


def test_differing_tokens_errors_restarts_and_too_little_traffic_roll_back() -> None:
    assert "greedy replay 2/3 equal" in judge(OLD, OLD, CONFIG, Replay(3, 2, "prompt p1 differs at token 4")).reason
    assert judge(OLD, OLD, CONFIG, Replay(0, 0, "SmokeError: refused")).promote is False
    assert "error rate 5.00% vs 0.00%" in judge(replace(OLD, errors=5), OLD, CONFIG, None).reason
    assert "restarts 1 vs 0" in judge(replace(OLD, restarts=1), OLD, CONFIG, None).reason
    assert "self-check failures 1 vs 0" in judge(replace(OLD, selfcheck_failures=1), OLD, CONFIG, None).reason
    assert "requests 5 vs 100 (needs >= 20 each)" in judge(replace(OLD, requests=5), OLD, CONFIG, None).reason


def test_unmeasured_numbers_pass_but_are_shown() -> None:
    none = replace(OLD, tok_s=None, tau=None)
    verdict = judge(none, replace(OLD, tok_s=None, tau=None), CONFIG, None)
    assert verdict.promote
    tau = next(r for r in verdict.rows if r.metric == "tau")
    assert (tau.canary, tau.rule) == ("-", ">= 0.9x (not measured)")


def test_the_window_goes_on_until_it_closes_unless_a_hard_rule_fails() -> None:
    config = CanaryConfig(min_requests=20, window=300, max_window=900)
    slow = replace(OLD, itl_p95=0.055)
    early = judge(slow, OLD, config, None, elapsed=60)
    assert early.decision is Decision.CONTINUE and early.reason == "window open, 60/300s"
    assert table(early)[-1] == "verdict: CONTINUE (window open, 60/300s)"
    assert judge(slow, OLD, config, None, elapsed=300).decision is Decision.ROLL_BACK
    crashed = judge(replace(OLD, restarts=1), OLD, config, None, elapsed=5)
    assert crashed.decision is Decision.ROLL_BACK and crashed.reason.startswith("restarts 1 vs 0")
    differ = judge(OLD, OLD, config, Replay(3, 2, "prompt p2 differs at token 0"), elapsed=0)
    assert differ.decision is Decision.ROLL_BACK and differ.reason.endswith(": prompt p2 differs at token 0")
    assert judge(OLD, OLD, config, None, elapsed=300).decision is Decision.PROMOTE


def test_too_little_traffic_measures_on_until_max_window_then_rolls_back() -> None:
    config = CanaryConfig(min_requests=20, window=300, max_window=900)
    quiet = replace(OLD, requests=7)
    more = judge(quiet, OLD, config, None, elapsed=310)
    assert more.decision is Decision.CONTINUE
    assert more.reason == (
        "too little traffic (7 and 100 requests, needs 20 each), measuring on up to 900s (310s so far)"
    )
    last = judge(quiet, OLD, config, None, elapsed=900)
    assert last.decision is Decision.ROLL_BACK and last.reason.startswith("requests 7 vs 100 (needs >= 20 each)")
    assert judge(replace(OLD, requests=25), OLD, config, None, elapsed=450).decision is Decision.PROMOTE


def test_time_per_output_token_stands_in_for_inter_token_latency() -> None:
    """An exporter without `inter_token_latency_seconds` (older SGLang) is measured by its time per output
    token; `_created` samples (prometheus_client's, outside multiprocess mode) are not counters to add."""
    m = 'model_name="Qwen/Qwen3-8B"'

    def tpot(fast: float, total: float) -> promtext.Scrape:
        return promtext.parse(
            f"sglang:num_requests_total{{{m}}} {total}\n"
            f"sglang:num_requests_created{{{m}}} 1.7e9\n"
            f'sglang:time_per_output_token_seconds_bucket{{le="0.01",{m}}} {fast}\n'
            f'sglang:time_per_output_token_seconds_bucket{{le="0.1",{m}}} {total}\n'
            f'sglang:time_per_output_token_seconds_bucket{{le="+Inf",{m}}} {total}\n'
            f"sglang:time_per_output_token_seconds_count{{{m}}} {total}\n"
            f"sglang:time_per_output_token_seconds_created{{{m}}} 1.7e9\n"
        )

    stats = group_stats([WorkerWindow(A, tpot(0, 0), tpot(0, 40), (), 0, 0)])
    assert stats.requests == 40 and stats.itl_p50 == pytest.approx(0.055)  # all 40 in (0.01, 0.1]


def test_an_unread_worker_is_no_comparison_not_zero_requests() -> None:
    """A worker whose /metrics did not answer is shown as unread (it is not a worker that served nothing):
    the window goes on while max_window allows, then rolls back naming the worker and why."""
    config = CanaryConfig(min_requests=1, window=10, max_window=30)
    good = WorkerWindow(A, scrape(0, 0, (0, 0, 0)), scrape(10, 0, (50, 60, 60)), (), 0, 0)
    unread = WorkerWindow(B, scrape(0, 0, (0, 0, 0)), promtext.Scrape({}, error="HTTP 401"), (), 0, 0)
    canary, old = group_stats([good]), group_stats([unread])
    assert (old.read, old.unread, old.requests) == (0, (f"{B}: HTTP 401",), 0)
    waiting = judge(canary, old, config, None, elapsed=10)
    assert waiting.decision is Decision.CONTINUE
    assert waiting.reason == f"/metrics unread ({B}: HTTP 401), measuring on up to 30s (10s so far)"
    last = judge(canary, old, config, None, elapsed=30)
    assert last.decision is Decision.ROLL_BACK
    assert last.reason.startswith("metrics read 1/1 vs 0/1 (needs every worker's /metrics)")
    assert last.reason.endswith(f": {B}: HTTP 401")
    assert table(last)[1].split()[:4] == ["metrics", "read", "1/1", "0/1"]


def test_a_hard_failure_before_the_window_names_only_the_hard_rules() -> None:
    """Rolled back at the first look (nothing measured yet): the reason is the replay, not '0 vs 0 requests'."""
    nothing = replace(OLD, requests=0, ttft_p95=None, itl_p95=None)
    verdict = judge(nothing, nothing, CONFIG, Replay(1, 0, "prompt arith differs at token 0"), elapsed=0)
    assert verdict.decision is Decision.ROLL_BACK
    assert verdict.reason == (
        "greedy replay 0/1 equal vs reference (needs all identical tokens): prompt arith differs at token 0"
    )
    assert [r.metric for r in verdict.rows if not r.ok] == ["requests", "greedy replay"]  # the table shows both


# sglang-router 0.3.2's /metrics, recorded from the real router (round robin) in front of two stand-in workers
# at 127.0.0.1:39101 (serves every request) and :39102 (answers SGLang's 400 "longer than the model's context
# length" to long prompts): the start after 40 served requests, the end after 40 more, 20 of them long.
ROUTER_START = promtext.parse((FIXTURES / "router" / "metrics-0.3.2-start.txt").read_text())
ROUTER_END = promtext.parse((FIXTURES / "router" / "metrics-0.3.2-end.txt").read_text())
REFUSING, SERVING = "http://127.0.0.1:39102", "http://127.0.0.1:39101"


def test_the_router_counts_what_clients_saw_and_a_refusing_canary_rolls_back_at_once() -> None:
    # The workers' own counters: the refusing one counts only the 10 it served, no abort (as SGLang)
    canary = group_stats([WorkerWindow(REFUSING, scrape(20, 0, (0, 0, 0)), scrape(30, 0, (0, 0, 0)), (), 0, 0,
                                       ROUTER_START, ROUTER_END)])  # fmt: skip
    old = group_stats([WorkerWindow(SERVING, scrape(20, 0, (0, 0, 0)), scrape(40, 0, (0, 0, 0)), (), 0, 0,
                                    ROUTER_START, ROUTER_END)])  # fmt: skip
    assert (canary.requests, canary.sent, canary.refused, canary.offered) == (10, 20, 10, 20)
    assert (old.requests, old.sent, old.refused) == (20, 20, 0)
    assert canary.error_rate == 0.5 and old.error_rate == 0.0
    verdict = judge(canary, old, CONFIG, None, elapsed=30.0)  # long before the window closes
    assert verdict.decision is Decision.ROLL_BACK
    assert verdict.reason == "refused 10 (50.00%) vs 0 (0.00%) (needs < 5 or <= old + 1.00%)"
    row = next(line for line in table(verdict) if line.startswith("refused"))
    assert row.split()[-1] == "FAIL"
    # Without the router's counters the same workers look healthy: 10 vs 20 requests, no errors
    blind = group_stats([WorkerWindow(REFUSING, scrape(20, 0, (0, 0, 0)), scrape(30, 0, (0, 0, 0)), (), 0, 0)])
    assert (blind.sent, blind.refused, blind.error_rate) == (None, 0.0, 0.0)


def test_router_counters_read_as_deltas_per_worker_with_restarts_and_older_names() -> None:
    # An aborted request the router also saw fail is one error, not two
    aborted = WorkerWindow(REFUSING, scrape(20, 0, (0, 0, 0)), scrape(30, 3, (0, 0, 0)), (), 0, 0,
                           ROUTER_START, ROUTER_END)  # fmt: skip
    stats = group_stats([aborted])
    assert (stats.errors, stats.refused, stats.error_rate) == (3, 7, 0.5)
    # A router restarted in the window counts from zero: its end is the delta
    restarted = WorkerWindow(SERVING, scrape(20, 0, (0, 0, 0)), scrape(40, 0, (0, 0, 0)), (), 0, 0, ROUTER_END,
                             ROUTER_START)  # fmt: skip
    assert group_stats([restarted]).sent == 20
    # Routers that count only requests sent: refused = sent - counted by the worker - its queue's growth
    older = promtext.parse(f'sgl_router_processed_requests_total{{worker="{A}"}} 50\n')
    zero = promtext.parse(f'sgl_router_processed_requests_total{{worker="{A}"}} 0\n')
    window = WorkerWindow(A, scrape(0, 0, (0, 0, 0)), scrape(40, 0, (0, 0, 0)), (), 0, 0, zero, older)
    assert (group_stats([window]).sent, group_stats([window]).refused) == (50, 10)
    # A worker the router never sent to has no series: 0 sent, nothing refused
    assert group_stats([WorkerWindow("http://elsewhere:1", scrape(0, 0, (0, 0, 0)), scrape(0, 0, (0, 0, 0)), (),
                                     0, 0, ROUTER_START, ROUTER_END)]).sent == 0  # fmt: skip
    # An unread router: no refusals claimed, the comparison waits (metrics read fails)
    unread = WorkerWindow(A, scrape(0, 0, (0, 0, 0)), scrape(40, 0, (0, 0, 0)), (), 0, 0, ROUTER_START,
                          promtext.Scrape({}, error="ConnectError"))  # fmt: skip
    stats = group_stats([unread])
    assert (stats.sent, stats.router_unread) == (None, "ConnectError")
    verdict = judge(stats, OLD, CONFIG, None, elapsed=400.0)
    assert verdict.decision is Decision.CONTINUE and "router /metrics: ConnectError" in verdict.reason
