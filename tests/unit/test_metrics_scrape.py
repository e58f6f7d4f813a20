"""The DDTREE numbers from a service's /metrics (`metrics.from_scrape`) and `opsctl status`'s choice of source
(`status.last_metrics`): on a recorded pair, SGLang's CPU engine's `ddtree_*` series and its DDTREE lines of the
same rounds (tests/fixtures/logs/sglang_policy_prom.log says how they were recorded), and on broken scrapes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from opsctl import metrics, promtext, status
from opsctl.cli import status as cli_status
from opsctl.commands import Cmd
from opsctl.inventory.load import load_inventory
from opsctl.remote.fake import FakeHost
from opsctl.systemd import ddtree_lines_cmd

FIXTURES = Path(__file__).parents[1] / "fixtures"
SCRAPE = (FIXTURES / "metrics" / "sglang-cpu-ddtree-policy.txt").read_text()
JOURNAL = [ln for ln in (FIXTURES / "logs" / "sglang_policy_prom.log").read_text().splitlines() if ln[:1] != "#"]
GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"


def _lines() -> list[metrics.DDTreeMetrics]:
    return [r for r in metrics.parse_lines(JOURNAL) if isinstance(r, metrics.DDTreeMetrics)]


def _weighted(key: str) -> float:
    """The lines' window means of `key` weighted by their windows' rounds: the mean over every round."""
    lines, before, total = _lines(), 0, 0.0
    for line in lines:
        total += getattr(line, key) * (line.rounds - before)
        before = line.rounds
    return total / lines[-1].rounds


def test_the_recorded_scrape_says_what_the_lines_of_the_same_rounds_say() -> None:
    got = metrics.from_scrape(promtext.parse(SCRAPE))
    last = _lines()[-1]
    assert got is not None
    assert (got.rounds, got.tokens) == (last.rounds, last.tokens) == (12, 18)
    assert got.tau == 18 / 12
    for key in ("nodes", "depth", "off_spine", "draft_ms", "build_ms", "verify_ms", "commit_ms"):
        assert getattr(got, key) == pytest.approx(_weighted(key), abs=0.0005), key  # the lines' 3 decimals
    busy_ms = sum(_weighted(k) for k in ("draft_ms", "build_ms", "verify_ms", "commit_ms")) * last.rounds
    assert got.tok_s == pytest.approx(last.tokens * 1000.0 / busy_ms, rel=1e-4)
    assert got.extra == {"width": "1.750"}  # 21 / 12
    assert got.policy is not None and last.policy is not None
    assert got.policy.choice == last.policy.choice == (metrics.PolicyBucket(1, 1, "tree3"),)
    assert (got.policy.switches, got.policy.probes) == (last.policy.switches, last.policy.probes) == (2, 2)
    assert got.policy.describe() == "tree3 at batch 1" and got.policy.mode == "" and got.policy.estimates == {}


def test_no_ddtree_series_no_round_yet_and_odd_lines() -> None:
    assert metrics.from_scrape(promtext.parse((FIXTURES / "metrics" / "reference-lab2-shadow.txt").read_text())) is None
    assert metrics.from_scrape(promtext.parse('ddtree_rounds_total{model_name="m"} 0.0\n')) is None
    assert metrics.from_scrape(promtext.Scrape({}, error="HTTP 404")) is None
    odd = (
        'ddtree_rounds_total{model_name="m"} 4\n'
        'ddtree_committed_tokens_total{model_name="m"} many\n'  # not a number: skipped, so 0 tokens
        'ddtree_tree_nodes_sum{model_name="m"} NaN\n'
        'ddtree_policy_shape_budget{bucket="x-y"} 3\n'
        'ddtree_policy_shape_budget{bucket="5-8"} 2.5\n'
        'ddtree_policy_shape_budget{bucket="9-"} -1\n'
        "ddtree_policy_shape_budget 7\n"
        "garbage line\n"
    )
    got = metrics.from_scrape(promtext.parse(odd))
    assert got is not None and got.rounds == 4 and got.tokens == 0 and got.tau == 0.0
    assert got.nodes == 0.0 and got.tok_s == 0.0 and got.policy is None  # no bucket label parses


def test_status_takes_metrics_where_it_has_the_ddtree_series_else_the_journal() -> None:
    journal = metrics.summarize(metrics.parse_lines(JOURNAL))
    assert journal.last_metrics is not None and journal.last_metrics.tau == 1.25  # the last window's
    got, source = status.last_metrics(promtext.parse(SCRAPE), journal)
    assert source is status.MetricsSource.PROMETHEUS and got is not None and got.tau == 1.5  # every round's
    for scrape in (promtext.Scrape({}, error="HTTP 404"), promtext.parse('sglang:num_running_reqs{a="b"} 0\n')):
        assert status.last_metrics(scrape, journal) == (journal.last_metrics, status.MetricsSource.JOURNAL)
    # the series at 0 after a restart: no round since, whatever older journal lines say
    restarted = promtext.parse('ddtree_rounds_total{model_name="m"} 0.0\n')
    assert status.last_metrics(restarted, journal) == (None, status.MetricsSource.PROMETHEUS)


def _row(monkeypatch: pytest.MonkeyPatch, metrics_answer: httpx.Response) -> status.ServiceStatus:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    inv = load_inventory(GOLDEN)
    host = inv.hosts[0]
    journal_cmd = ddtree_lines_cmd("opsctl-ref-shadow.service").display()

    def handler(cmd: Cmd) -> tuple[int, str, str] | None:
        if cmd.display() == journal_cmd:
            return (0, "\n".join(JOURNAL) + "\n", "")
        if cmd.display().startswith("systemctl show"):
            return (0, "ActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n", "")
        return None

    def answer(request: httpx.Request) -> httpx.Response:
        return metrics_answer if request.url.path == "/metrics" else httpx.Response(200)

    http = httpx.Client(transport=httpx.MockTransport(answer))
    return status.collect(FakeHost(host.name, handler=handler), host, host.service("ref-shadow"), http)


def test_a_status_row_reads_metrics_then_falls_back(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    row = _row(monkeypatch, httpx.Response(200, text=SCRAPE))
    assert row.metrics_source is status.MetricsSource.PROMETHEUS
    assert row.last_metrics is not None and row.last_metrics.rounds == 12 and row.last_metrics.tau == 1.5
    assert row.init is not None and row.init.mode == "tree"  # the journal's init line still read
    cli_status._table([row])
    assert "tau=1.50 nodes=4.7 tok/s=1.9 policy tree3 at batch 1 (since start, /metrics)" in capsys.readouterr().err

    row = _row(monkeypatch, httpx.Response(404))
    assert row.metrics_source is status.MetricsSource.JOURNAL
    assert row.last_metrics is not None and row.last_metrics.tau == 1.25
    cli_status._table([row])
    assert "tau=1.25 nodes=3.0 tok/s=1.7 policy auto: tree3 at batch 1 (last line)" in capsys.readouterr().err
