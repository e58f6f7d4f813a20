"""The rendered monitoring files through Prometheus's own checker: `promtool check config`, `promtool check
rules`, and `promtool test rules` for every alert (fires when it should, stays silent when it should not).
promtool comes from Debian's `prometheus` package (scripts/setup installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.cli.monitor import write_files
from opsctl.monitor.render import RULE_FILES, render_monitoring
from tests.unit.monitor_fleet import monitor_fleet

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: scripts/setup installs Debian's prometheus")

# The test inventory's thresholds: short windows so the rule tests stay short
MONITORING = {
    "service_down_for": 60, "tau_trailing": 3600, "tau_for": 300, "tau_ratio": 0.6,
    "fallback_share": 0.5, "fallback_for": 300, "ttft_p95": 2.5, "ttft_for": 120,
}  # fmt: skip
RUNBOOK = "docs/runbook.md"
TARGETS = {  # worker -> (instance, mode): what file_sd attaches to each service's series
    "h1/a": ("10.0.0.1:30000", "tree"),
    "h1/b": ("10.0.0.1:30001", "baseline"),
    "h2/a": ("10.0.0.2:30000", "shadow"),
}


def _promtool(*args: str, cwd: Path) -> str:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("monitor")
    write_files(out, render_monitoring(monitor_fleet(MONITORING)))
    return out


def test_promtool_accepts_config_and_rules(rendered: Path) -> None:
    assert "SUCCESS" in _promtool("check", "config", "prometheus.yml", cwd=rendered)
    out = _promtool("check", "rules", *RULE_FILES, cwd=rendered)
    assert "SUCCESS: 9 rules found" in out and "SUCCESS: 7 rules found" in out


def _labels(worker: str) -> dict[str, str]:
    host, service = worker.split("/")
    instance, mode = TARGETS[worker]
    return {"job": "opsctl-services", "instance": instance, "host": host, "service": service, "worker": worker,
            "mode": mode, "engine": "reference", "model": "tiny" if worker == "h1/a" else "m"}  # fmt: skip


def _series(name: str, worker: str, values: str, **extra: str) -> dict[str, str]:
    labels = {**_labels(worker), **extra}
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _up(values: dict[str, str], router: str = "1+0x600") -> list[dict[str, str]]:
    """`up` of every service (a worker's values, default always up) and of the router."""
    series = [_series("up", w, values.get(w, "1+0x600")) for w in TARGETS]
    router_up = 'up{job="opsctl-routers", instance="10.0.0.1:30081", host="h1", router="front"}'
    return [*series, {"series": router_up, "values": router}]


def _expect(alert: str, at: str, firing: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": firing}


def _fired(labels: dict[str, str], severity: str, summary: str, anchor: str) -> dict[str, Any]:
    return {
        "exp_labels": {**labels, "severity": severity},
        "exp_annotations": {"summary": summary, "runbook_url": f"{RUNBOOK}#{anchor}"},
    }


HA = {"host": "h1", "service": "a"}
KINDS, SELFCHECK = "ddtree_decode_rounds_total", "ddtree_selfcheck_failed"
TTFT = "sglang:time_to_first_token_seconds_bucket"

RULE_TESTS: list[dict[str, Any]] = [
    {  # one service stops answering at 2m: pending for 60 s, firing after; the others stay silent
        "interval": "1m",
        "input_series": _up({"h1/a": "1 1 0x10 1x10"}),
        "alert_rule_test": [
            _expect("OpsctlServiceDown", "1m", []),
            _expect("OpsctlServiceDown", "2m30s", []),
            _expect("OpsctlServiceDown", "4m", [
                _fired(_labels("h1/a"), "critical", "h1/a does not answer /metrics", "opsctlservicedown"),
            ]),
            _expect("OpsctlServiceDown", "15m", []),  # healed at 13m
            _expect("OpsctlRouterNoHealthyWorkers", "4m", []),
        ],
    },
    {  # every worker of the router down; and the router itself
        "interval": "1m",
        "input_series": _up({w: "1 0x20" for w in TARGETS}, router="1 0x20"),
        "alert_rule_test": [
            _expect("OpsctlRouterNoHealthyWorkers", "1m30s", []),
            _expect("OpsctlRouterNoHealthyWorkers", "5m", [
                _fired({"router": "front"}, "critical", "router front: none of its 3 workers answers /metrics",
                       "opsctlrouternohealthyworkers"),
            ]),
            _expect("OpsctlRouterDown", "5m", [
                _fired({"job": "opsctl-routers", "instance": "10.0.0.1:30081", "host": "h1", "router": "front"},
                       "critical", "router front does not answer /metrics", "opsctlrouterdown"),
            ]),
        ],
    },
    {  # tau 4 for two hours, then 2: below 0.6 of its trailing hour
        "interval": "1m",
        "input_series": [
            _series("ddtree_rounds_total", "h1/a", "0+100x180"),
            _series("ddtree_committed_tokens_total", "h1/a", "0+400x120 48200+200x60"),
        ],
        "alert_rule_test": [
            _expect("OpsctlTauDrop", "110m", []),
            _expect("OpsctlTauDrop", "140m", [
                _fired(HA, "warning", "h1/a: tau 2.00 is below 0.6 of its trailing level", "opsctltaudrop"),
            ]),
        ],
    },
    {  # 90% of decode rounds run DFLASH's chain: fires for the tree service, not for the shadow one
        "interval": "1m",
        "input_series": [
            *_up({}),
            *(_series(KINDS, w, "0+90x40", kind="dflash", reason="sampling") for w in ("h1/a", "h2/a")),
            *(_series(KINDS, w, "0+10x40", kind="tree", reason="") for w in ("h1/a", "h2/a")),
            _series(KINDS, "h1/b", "0+0x40", kind="dflash", reason="sampling"),
        ],
        "alert_rule_test": [
            _expect("OpsctlTreeMostlyFallback", "3m", []),
            _expect("OpsctlTreeMostlyFallback", "20m", [
                _fired(HA, "warning", "h1/a: a tree service runs DFLASH's chain verify in most decode rounds",
                       "opsctltreemostlyfallback"),
            ]),
        ],
    },
    {  # a self-check fails at 2m: fires at once
        "interval": "1m",
        "input_series": [_series(SELFCHECK, "h1/a", "0 0 1x10"), _series(SELFCHECK, "h2/a", "0x12")],
        "alert_rule_test": [
            _expect("OpsctlSelfCheckDisagreement", "1m", []),
            _expect("OpsctlSelfCheckDisagreement", "3m", [
                _fired(HA, "critical", "h1/a: a self-check found the tree verify differs from the chain verify",
                       "opsctlselfcheckdisagreement"),
            ]),
        ],
    },
    {  # h1/a's first tokens take 1-5 s (p95 4.8 s), h1/b's under 1 s
        "interval": "1m",
        "input_series": [
            _series(TTFT, "h1/a", "0x20", le="1"),
            _series(TTFT, "h1/a", "0+10x20", le="5"),
            _series(TTFT, "h1/a", "0+10x20", le="+Inf"),
            *(_series(TTFT, "h1/b", "0+10x20", le=le) for le in ("1", "5", "+Inf")),
        ],
        "alert_rule_test": [
            _expect("OpsctlTTFTHigh", "2m", []),
            _expect("OpsctlTTFTHigh", "10m", [
                _fired(HA, "warning", "h1/a: p95 time to first token 4.8s is over 2.5s", "opsctlttfthigh"),
            ]),
        ],
    },
]  # fmt: skip


def test_every_alert_fires_and_stays_silent_as_specified(rendered: Path) -> None:
    tested = {t["alertname"] for group in RULE_TESTS for t in group["alert_rule_test"] if t["exp_alerts"]}
    alerts = yaml.safe_load((rendered / RULE_FILES[1]).read_text())["groups"][0]["rules"]
    assert tested == {r["alert"] for r in alerts}  # every alert has a test in which it fires
    spec = {"rule_files": list(RULE_FILES), "evaluation_interval": "15s", "tests": RULE_TESTS}
    (rendered / "alerts_test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "SUCCESS" in _promtool("test", "rules", "alerts_test.yml", cwd=rendered)


def test_promtool_test_rules_can_fail(rendered: Path) -> None:
    """A wrong expectation fails: the rule tests above can catch a broken rule."""
    wrong = [{**RULE_TESTS[4], "alert_rule_test": [_expect("OpsctlSelfCheckDisagreement", "3m", [])]}]
    spec = {"rule_files": list(RULE_FILES), "evaluation_interval": "15s", "tests": wrong}
    (rendered / "wrong_test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "test", "rules", "wrong_test.yml"], cwd=rendered, capture_output=True, text=True)
    assert done.returncode == 1 and "OpsctlSelfCheckDisagreement" in done.stdout + done.stderr
