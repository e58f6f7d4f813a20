"""`opsctl logs --metrics` and `opsctl status` show the shape policy's choice from recorded DDTREE lines (and
nothing new for lines without it); `--json` carries it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl import metrics
from opsctl.cli import logs as cli_logs
from opsctl.cli import status as cli_status
from opsctl.status import ServiceStatus

LOGS = Path(__file__).parents[1] / "fixtures" / "logs"


def _lines(name: str) -> list[str]:
    return [ln for ln in (LOGS / name).read_text().splitlines() if not ln.startswith("#")]


def test_logs_metrics_shows_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    cli_logs._metrics({"lab8/ref-tree": _lines("ddtree_policy.log")}, as_json=False)
    err = capsys.readouterr().err
    assert (
        "lab8/ref-tree: policy auto: tree32 at batch 1, tree16 at batch 5-8, chain at batch 17-32; "
        "tok/ms tree32=4.52 tree16=6.13 tree8=6.50 chain=6.94 (switches 2, probes 115)"
    ) in err
    assert "1 malformed metrics lines ignored" in err


def test_logs_metrics_without_policy_lines_says_nothing_of_it(capsys: pytest.CaptureFixture[str]) -> None:
    cli_logs._metrics({"lab1/tree": _lines("ddtree_contract.log")}, as_json=False)
    assert "policy" not in capsys.readouterr().err


def test_logs_metrics_json_carries_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    cli_logs._metrics({"s": _lines("ddtree_policy.log")}, as_json=True)
    data = json.loads(capsys.readouterr().out)
    policy = data["summary"]["s"]["last_metrics"]["policy"]
    assert policy["choice"][-1] == {"lo": 17, "hi": 32, "shape": "chain"}
    assert policy["estimates"]["chain"] == 6.936
    first = data["lines"][0]["record"]["policy"]
    assert first["estimates"] == {"tree12": 0.016, "tree6": None, "tree3": None, "chain": 0.104}


def _status(last: metrics.DDTreeMetrics | None) -> ServiceStatus:
    return ServiceStatus(
        host="lab8", service="ref-tree", unit=None, current="r1", mode="tree", released_at=None,
        runtime_version="0.1.0", releases=1, bad_releases=0, rollback_to=None, health="HTTP 200 in 3 ms",
        healthy=True, last_metrics=last, init=None,
    )  # fmt: skip


def test_status_line_shows_the_policy(capsys: pytest.CaptureFixture[str]) -> None:
    records = metrics.parse_lines(_lines("ddtree_policy.log"))
    last = [r for r in records if isinstance(r, metrics.DDTreeMetrics)][-1]
    cli_status._table([_status(last)])
    err = capsys.readouterr().err
    assert "tok/s=381.0 policy auto: tree32 at batch 1, tree16 at batch 5-8, chain at batch 17-32" in err
    old = metrics.parse_lines(_lines("ddtree_contract.log"))[2]
    assert isinstance(old, metrics.DDTreeMetrics)
    cli_status._table([_status(old)])
    assert "policy" not in capsys.readouterr().err


def test_a_real_sglang_policy_log_shows_the_chain_then_the_tree_again(capsys: pytest.CaptureFixture[str]) -> None:
    """SGLang's tree worker's own lines (recorded from the CPU engine test): every line parses; the window in
    which batch 2 ran the chain shows it, and the last line the tree it went back to."""
    lines = _lines("sglang_policy.log")
    records = [r for r in metrics.parse_lines(lines) if isinstance(r, metrics.DDTreeMetrics)]
    assert len(records) == sum("DDTREE metrics" in ln for ln in lines)
    described = [r.policy.describe() for r in records if r.policy is not None]
    assert "auto: chain at batch 2" in described
    assert described[-1] == "auto: tree7 at batch 1-2"
    chain = described.index("auto: chain at batch 2")
    assert described[0] == "auto: tree7 at batch 2" and "auto: tree7 at batch 2" in described[chain:]
    cli_logs._metrics({"ct200/tree": lines}, as_json=False)
    assert "ct200/tree: policy auto: tree7 at batch 1-2; tok/ms tree7=1.50 tree3=1.50 chain=0.04 (switches 2" in (
        capsys.readouterr().err
    )
