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
    "error_ratio": 0.05, "error_for": 120, "queue_for": 120, "kv_for": 120,
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
    assert "SUCCESS: 12 rules found" in out and "SUCCESS: 11 rules found" in out


def _labels(worker: str) -> dict[str, str]:
    host, service = worker.split("/")
    instance, mode = TARGETS[worker]
    return {"job": "opsctl-services", "instance": instance, "host": host, "service": service, "worker": worker,
            "mode": mode, "engine": "reference", "model": "tiny" if worker == "h1/a" else "m"}  # fmt: skip


def _identity(worker: str) -> dict[str, str]:
    """The labels of a service's alert on recorded series: the target's labels but job and instance."""
    return {k: v for k, v in _labels(worker).items() if k not in ("job", "instance")}


ROUTER = {"job": "opsctl-routers", "instance": "10.0.0.1:30081", "host": "h1", "router": "front"}


def _router_series(name: str, values: str, **extra: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in {**ROUTER, **extra}.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _health(values: dict[str, str]) -> list[dict[str, str]]:
    """The router's `smg_worker_health` per worker (relabelled: `worker` is host/service), default healthy."""
    return [
        _router_series("smg_worker_health", values.get(w, "1+0x30"), worker=w, worker_url=f"http://{TARGETS[w][0]}")
        for w in TARGETS
    ]


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


HA = _identity("h1/a")
FRONT = {"host": "h1", "router": "front"}
KINDS, SELFCHECK = "ddtree_decode_rounds_total", "ddtree_selfcheck_failed"
TTFT = "sglang:time_to_first_token_seconds_bucket"

RULE_TESTS: list[dict[str, Any]] = [
    {  # one service stops answering at 2m: pending for 60 s, firing after; the others stay silent
        "interval": "1m",
        "input_series": [*_up({"h1/a": "1 1 0x10 1x10"}), *_health({})],
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
    {  # the router marks every worker unhealthy from 1m (the workers' own scrapes still work): its view counts
        "interval": "1m",
        "input_series": [*_up({}), *_health({w: "1 0x20" for w in TARGETS})],
        "alert_rule_test": [
            _expect("OpsctlRouterNoHealthyWorkers", "1m30s", []),  # pending: for 60 s
            _expect("OpsctlRouterNoHealthyWorkers", "5m", [
                _fired(FRONT, "critical", "router front has no healthy worker: clients get errors",
                       "opsctlrouternohealthyworkers"),
            ]),
            _expect("OpsctlServiceDown", "5m", []),
        ],
    },
    {  # one worker stays healthy: silent
        "interval": "1m",
        "input_series": [*_up({}), *_health({"h1/a": "1 0x20", "h1/b": "1 0x20"})],
        "alert_rule_test": [_expect("OpsctlRouterNoHealthyWorkers", "5m", [])],
    },
    {  # the router lists no worker at all (no smg_worker_health series): 0 healthy
        "interval": "1m",
        "input_series": _up({}),
        "alert_rule_test": [
            _expect("OpsctlRouterNoHealthyWorkers", "5m", [
                _fired(FRONT, "critical", "router front has no healthy worker: clients get errors",
                       "opsctlrouternohealthyworkers"),
            ]),
        ],
    },
    {  # the router itself down: OpsctlRouterDown, not a claim about its workers
        "interval": "1m",
        "input_series": _up({}, router="1 0x20"),
        "alert_rule_test": [
            _expect("OpsctlRouterNoHealthyWorkers", "5m", []),
            _expect("OpsctlRouterDown", "5m", [
                _fired(ROUTER, "critical", "router front does not answer /metrics", "opsctlrouterdown"),
            ]),
        ],
    },
    {  # 10% of the router's answers are 503
        "interval": "1m",
        "input_series": [
            _router_series("smg_http_responses_total", "0+90x20", status_code="200", error_code=""),
            _router_series("smg_http_responses_total", "0+10x20", status_code="503", error_code=""),
        ],
        "alert_rule_test": [
            _expect("OpsctlRouterErrors", "1m", []),
            _expect("OpsctlRouterErrors", "10m", [
                _fired(FRONT, "critical", "router front: 10% of answers are 5xx", "opsctlroutererrors"),
            ]),
        ],
    },
    {  # 1% 5xx and 10% 4xx (the clients' errors): silent
        "interval": "1m",
        "input_series": [
            _router_series("smg_http_responses_total", "0+89x20", status_code="200", error_code=""),
            _router_series("smg_http_responses_total", "0+10x20", status_code="400", error_code=""),
            _router_series("smg_http_responses_total", "0+1x20", status_code="500", error_code=""),
        ],
        "alert_rule_test": [_expect("OpsctlRouterErrors", "10m", [])],
    },
    {  # h1/a aborts 10% of its requests, h1/b 1%
        "interval": "1m",
        "input_series": [
            _series("sglang:num_requests_total", "h1/a", "0+100x20"),
            _series("sglang:num_aborted_requests_total", "h1/a", "0+10x20"),
            _series("sglang:num_requests_total", "h1/b", "0+100x20"),
            _series("sglang:num_aborted_requests_total", "h1/b", "0+1x20"),
        ],
        "alert_rule_test": [
            _expect("OpsctlRequestErrors", "1m", []),
            _expect("OpsctlRequestErrors", "10m", [
                _fired(HA, "warning", "h1/a: 10% of requests aborted", "opsctlrequesterrors"),
            ]),
        ],
    },
    {  # h1/a's queue grows by one a minute; h1/b's stays at 5; h2/a's empties now and then
        "interval": "1m",
        "input_series": [
            _series("sglang:num_queue_reqs", "h1/a", "1+1x30"),
            _series("sglang:num_queue_reqs", "h1/b", "5x30"),
            _series("sglang:num_queue_reqs", "h2/a", " ".join(["0 1 2 3 4"] * 6)),
        ],
        "alert_rule_test": [
            _expect("OpsctlQueueGrowing", "1m30s", []),  # pending: for 120 s
            _expect("OpsctlQueueGrowing", "20m", [
                _fired(HA, "warning", "h1/a: requests queue and the queue keeps growing", "opsctlqueuegrowing"),
            ]),
        ],
    },
    {  # h1/a's KV cache 99% used, h1/b's 50%
        "interval": "1m",
        "input_series": [
            _series("sglang:token_usage", "h1/a", "0.99x20"),
            _series("sglang:token_usage", "h1/b", "0.5x20"),
        ],
        "alert_rule_test": [
            _expect("OpsctlKVCacheFull", "1m", []),
            _expect("OpsctlKVCacheFull", "5m", [
                _fired(HA, "warning", "h1/a: KV cache 99% used", "opsctlkvcachefull"),
            ]),
        ],
    },
    {  # tau 4.0 for two hours, then 1.9 for two: below 0.6 of the baseline, and still firing 55 minutes in
        # (a trailing average that takes the drop in would have let it resolve after ~24 minutes)
        "interval": "1m",
        "input_series": [
            _series("ddtree_rounds_total", "h1/a", "0+100x240"),
            _series("ddtree_committed_tokens_total", "h1/a", "0+400x120 48190+190x119"),
        ],
        "alert_rule_test": [
            _expect("OpsctlTauDrop", "110m", []),
            *(_expect("OpsctlTauDrop", at, [
                _fired(HA, "warning", "h1/a: tau 1.90 is below 0.6 of its trailing level", "opsctltaudrop"),
            ]) for at in ("140m", "150m", "175m")),
        ],
    },
    {  # tau 4.0, then 3.0: a smaller step than tau_ratio, silent
        "interval": "1m",
        "input_series": [
            _series("ddtree_rounds_total", "h1/a", "0+100x240"),
            _series("ddtree_committed_tokens_total", "h1/a", "0+400x120 48300+300x119"),
        ],
        "alert_rule_test": [_expect("OpsctlTauDrop", at, []) for at in ("130m", "150m", "175m")],
    },
    {  # 90% of the tree service's decode rounds run DFLASH's chain: fires; the shadow service runs DFLASH's in
        # every round (reason "shadow", by design): silent
        "interval": "1m",
        "input_series": [
            *_up({}),
            _series(KINDS, "h1/a", "0+90x40", kind="dflash", reason="sampling"),
            _series(KINDS, "h1/a", "0+10x40", kind="tree", reason=""),
            _series(KINDS, "h2/a", "0+100x40", kind="dflash", reason="shadow"),
            _series(KINDS, "h2/a", "0+0x40", kind="tree", reason=""),
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
    selfcheck = next(g for g in RULE_TESTS if g["alert_rule_test"][0]["alertname"] == "OpsctlSelfCheckDisagreement")
    wrong = [{**selfcheck, "alert_rule_test": [_expect("OpsctlSelfCheckDisagreement", "3m", [])]}]
    spec = {"rule_files": list(RULE_FILES), "evaluation_interval": "15s", "tests": wrong}
    (rendered / "wrong_test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "test", "rules", "wrong_test.yml"], cwd=rendered, capture_output=True, text=True)
    assert done.returncode == 1 and "OpsctlSelfCheckDisagreement" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("monitoring", "link"),
    [
        ({"runbook_base_url": "https://git.example.com/ops/opsctl/blob/main/docs/"},
         "https://git.example.com/ops/opsctl/blob/main/docs/runbook.md"),
        ({"runbook_url": "https://wiki.example.com:8443/ops/opsctl-runbook.md"},
         "https://wiki.example.com:8443/ops/opsctl-runbook.md"),
    ],
)  # fmt: skip
def test_alerts_link_to_the_absolute_runbook(tmp_path: Path, monitoring: dict[str, str], link: str) -> None:
    """With a runbook key set, a firing alert's runbook_url is absolute, as Prometheus expands it; silent alerts
    stay silent (the self-check case above, with the links changed)."""
    write_files(tmp_path, render_monitoring(monitor_fleet({**MONITORING, **monitoring})))
    selfcheck = next(g for g in RULE_TESTS if g["alert_rule_test"][0]["alertname"] == "OpsctlSelfCheckDisagreement")
    fired = _fired(HA, "critical", "h1/a: a self-check found the tree verify differs from the chain verify", "x")
    fired["exp_annotations"]["runbook_url"] = f"{link}#opsctlselfcheckdisagreement"
    case = {**selfcheck, "alert_rule_test": [_expect("OpsctlSelfCheckDisagreement", "1m", []),
                                             _expect("OpsctlSelfCheckDisagreement", "3m", [fired])]}  # fmt: skip
    spec = {"rule_files": list(RULE_FILES), "evaluation_interval": "15s", "tests": [case]}
    (tmp_path / "links_test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "SUCCESS" in _promtool("test", "rules", "links_test.yml", cwd=tmp_path)


def test_recording_windows_hold_samples_at_the_longest_scrape_interval(tmp_path: Path) -> None:
    """At `scrape_interval: 300` every window is 4 scrapes wide: tok/s, tau and TTFT are recorded (a fixed 1m or
    5m window would hold one sample or none, and the panels would go blank)."""
    write_files(tmp_path, render_monitoring(monitor_fleet({"scrape_interval": 300})))
    ha = ", ".join(f'{k}="{v}"' for k, v in _identity("h1/a").items())
    spec = {
        "rule_files": list(RULE_FILES),
        "evaluation_interval": "5m",
        "tests": [{
            "interval": "5m",
            "input_series": [
                _series("sglang:generation_tokens_total", "h1/a", "0+3000x24"),  # 10 tok/s
                _series("ddtree_rounds_total", "h1/a", "0+300x24"),
                _series("ddtree_committed_tokens_total", "h1/a", "0+1200x24"),  # tau 4
                *(_series(TTFT, "h1/a", "0+60x24", le=le) for le in ("1", "+Inf")),
            ],
            "promql_expr_test": [
                {"expr": "opsctl:tok_s:rate", "eval_time": "60m",
                 "exp_samples": [{"labels": f"opsctl:tok_s:rate{{{ha}}}", "value": 10}]},
                {"expr": "opsctl:ddtree_tau:rate", "eval_time": "60m",
                 "exp_samples": [{"labels": f"opsctl:ddtree_tau:rate{{{ha}}}", "value": 4}]},
                {"expr": "opsctl:ttft_seconds:p50", "eval_time": "60m",
                 "exp_samples": [{"labels": f"opsctl:ttft_seconds:p50{{{ha}}}", "value": 0.5}]},
            ],
        }],
    }  # fmt: skip
    (tmp_path / "windows_test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert "SUCCESS" in _promtool("test", "rules", "windows_test.yml", cwd=tmp_path)
    recording = (tmp_path / RULE_FILES[0]).read_text()
    assert "[1200s]" in recording and "[1m]" not in recording and "[300s]" not in recording
