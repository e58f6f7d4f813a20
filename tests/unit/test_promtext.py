"""Prometheus text as values: a recorded reference-server scrape, SGLang's label shapes, odd lines skipped, a
histogram's window and quantile as PromQL's histogram_quantile computes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import promtext

FIXTURES = Path(__file__).parents[1] / "fixtures" / "metrics"

# The shape SGLang 0.5.23's TokenizerMetricsCollector writes (labels model_name and is_streaming), two label sets
SGLANG = """\
# HELP sglang:num_requests_total Number of requests processed.
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{is_streaming="true",model_name="Qwen/Qwen3-8B"} 30.0
sglang:num_requests_total{is_streaming="false",model_name="Qwen/Qwen3-8B"} 10.0
sglang:inter_token_latency_seconds_bucket{le="0.01",model_name="Qwen/Qwen3-8B"} 50.0
sglang:inter_token_latency_seconds_bucket{le="0.02",model_name="Qwen/Qwen3-8B"} 90.0
sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="Qwen/Qwen3-8B"} 100.0
sglang:inter_token_latency_seconds_count{model_name="Qwen/Qwen3-8B"} 100.0
a line that is not a sample
sglang:odd{model_name="x"} NaN
"""


def test_recorded_reference_scrape() -> None:
    scrape = promtext.parse((FIXTURES / "reference-lab2-shadow.txt").read_text())
    assert scrape.total("sglang:num_requests_total") == 1.0
    assert scrape.total("sglang:num_aborted_requests_total") == 0.0
    ttft = scrape.histogram("sglang:time_to_first_token_seconds")
    assert ttft is not None and ttft.count == 1.0 and ttft.buckets[-1] == (float("inf"), 1.0)
    assert ttft.quantile(0.5) == pytest.approx(0.25 + 0.25 * 0.5)  # the one request: 0.44 s, in (0.25, 0.5]
    assert scrape.total("sglang:nonexistent") is None and scrape.skipped == 0


def test_sglang_label_sets_are_summed_and_odd_lines_skipped() -> None:
    scrape = promtext.parse(SGLANG)
    assert scrape.total("sglang:num_requests_total") == 40.0
    assert scrape.skipped == 2
    itl = scrape.histogram("sglang:inter_token_latency_seconds")
    assert itl is not None
    assert itl.quantile(0.5) == pytest.approx(0.01)
    assert itl.quantile(0.7) == pytest.approx(0.015)  # rank 70: 20 of the 40 in (0.01, 0.02]
    assert itl.quantile(0.95) == pytest.approx(0.02)  # in +Inf: the highest finite bound


def test_window_is_the_difference_and_a_restart_counts_from_zero() -> None:
    start = promtext.Histogram(((0.01, 10.0), (0.1, 20.0), (float("inf"), 20.0)), 20.0)
    end = promtext.Histogram(((0.01, 10.0), (0.1, 30.0), (float("inf"), 31.0)), 31.0)
    window = end.minus(start)
    assert window.buckets == ((0.01, 0.0), (0.1, 10.0), (float("inf"), 11.0)) and window.count == 11.0
    assert window.quantile(0.5) == pytest.approx(0.01 + 0.09 * 5.5 / 10)
    restarted = promtext.Histogram(((0.01, 1.0), (float("inf"), 2.0)), 2.0)
    assert restarted.minus(start) == restarted
    assert promtext.Histogram(((float("inf"), 0.0),), 0.0).quantile(0.95) is None
    both = window.plus(window)
    assert both.count == 22.0 and both.quantile(0.5) == window.quantile(0.5)


def test_total_where_selects_label_sets() -> None:
    from opsctl import promtext as pt

    scrape = pt.parse(
        'smg_worker_cb_outcomes_total{worker="http://a:1",outcome="success"} 7\n'
        'smg_worker_cb_outcomes_total{worker="http://a:1",outcome="failure"} 2\n'
        'smg_worker_cb_outcomes_total{worker="http://b:1",outcome="success"} 5\n'
    )
    assert scrape.total("smg_worker_cb_outcomes_total") == 14
    assert scrape.total("smg_worker_cb_outcomes_total", {"worker": "http://a:1"}) == 9
    assert scrape.total("smg_worker_cb_outcomes_total", {"worker": "http://b:1", "outcome": "failure"}) is None


def test_an_odd_line_in_the_middle_hides_nothing_after_it() -> None:
    scrape = promtext.parse(
        '# TYPE a counter\na_total{x="1"} 1\nthis is not a sample\na_total{x="2"} 2\n'
        'b{path="/v1/chat",note="say \\"hi\\" {now}"} 3 1700000000000\n'
    )
    assert scrape.skipped == 1 and scrape.total("a_total") == 3.0
    assert scrape.samples["b"] == (({"path": "/v1/chat", "note": 'say "hi" {now}'}, 3.0),)
