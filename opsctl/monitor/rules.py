"""Prometheus recording and alert rules for an inventory, as values (dicts that YAML-dump to a rule file).

Label values come from the inventory, where host, service and router names are safe names (lowercase letters,
digits, `-`, `_`), so they go into PromQL selectors and regexes as they are; thresholds are validated numbers
(opsctl.inventory.monitoring) printed with `repr`. Alert annotations name the runbook's anchor for the alert.
"""

from __future__ import annotations

from typing import Any

from opsctl.inventory.model import Inventory, Router

SERVICES_JOB = "opsctl-services"
ROUTERS_JOB = "opsctl-routers"
BY = "host, service"

# alert -> the runbook's anchor (docs/runbook.md, "Monitoring alerts")
RUNBOOK_ANCHORS = {
    "OpsctlServiceDown": "opsctlservicedown",
    "OpsctlRouterDown": "opsctlrouterdown",
    "OpsctlRouterNoHealthyWorkers": "opsctlrouternohealthyworkers",
    "OpsctlTauDrop": "opsctltaudrop",
    "OpsctlTreeMostlyFallback": "opsctltreemostlyfallback",
    "OpsctlSelfCheckDisagreement": "opsctlselfcheckdisagreement",
    "OpsctlTTFTHigh": "opsctlttfthigh",
}


def _seconds(n: int) -> str:
    return f"{n}s"


def recording_rules(inv: Inventory) -> dict[str, Any]:
    """Per service (host, service): tok/s, tau and its trailing level, TTFT / ITL quantiles, the share of
    decode rounds that ran DFLASH's chain verify instead of a tree."""
    m = inv.monitoring

    def quantile(q: float, metric: str) -> str:
        return f"histogram_quantile({q}, sum by ({BY}, le) (rate({metric}_bucket[5m])))"

    rules = [
        ("opsctl:tok_s:rate1m", f"sum by ({BY}) (rate(sglang:generation_tokens_total[1m]))"),
        (
            "opsctl:ddtree_tau:rate5m",
            f"sum by ({BY}) (rate(ddtree_committed_tokens_total[5m])) / sum by ({BY}) (rate(ddtree_rounds_total[5m]))",
        ),
        (
            "opsctl:ddtree_tok_s:rate5m",
            f"sum by ({BY}) (rate(ddtree_committed_tokens_total[5m])) "
            f"/ sum by ({BY}) (rate(ddtree_phase_seconds_total[5m]))",
        ),
        (
            "opsctl:ddtree_fallback_share:rate10m",
            f'sum by ({BY}) (rate(ddtree_decode_rounds_total{{kind="dflash"}}[10m])) '
            f"/ sum by ({BY}) (rate(ddtree_decode_rounds_total[10m]))",
        ),
        ("opsctl:ttft_seconds:p50_5m", quantile(0.5, "sglang:time_to_first_token_seconds")),
        ("opsctl:ttft_seconds:p95_5m", quantile(0.95, "sglang:time_to_first_token_seconds")),
        ("opsctl:itl_seconds:p50_5m", quantile(0.5, "sglang:inter_token_latency_seconds")),
        ("opsctl:itl_seconds:p95_5m", quantile(0.95, "sglang:inter_token_latency_seconds")),
    ]
    trailing = (
        "opsctl:ddtree_tau:trailing",
        f"avg_over_time(opsctl:ddtree_tau:rate5m[{_seconds(m.tau_trailing)}])",
    )
    return {
        "groups": [
            {
                "name": "opsctl-recording",
                "interval": _seconds(m.scrape_interval),
                "rules": [{"record": name, "expr": expr} for name, expr in rules],
            },
            {  # a second group, evaluated after the first one's series exist
                "name": "opsctl-recording-trailing",
                "interval": _seconds(m.scrape_interval),
                "rules": [{"record": trailing[0], "expr": trailing[1]}],
            },
        ]
    }


def _alert(
    inv: Inventory, name: str, expr: str, for_s: int, severity: str, summary: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    url = f"{inv.monitoring.runbook_url}#{RUNBOOK_ANCHORS[name]}"
    rule: dict[str, Any] = {"alert": name, "expr": expr, "for": _seconds(for_s)}
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {"summary": summary, "runbook_url": url}
    return rule


def _router_alert(inv: Inventory, router: Router) -> dict[str, Any]:
    workers = "|".join(f"{w.host}/{w.service}" for w in router.workers)
    expr = f'(sum(up{{job="{SERVICES_JOB}", worker=~"{workers}"}}) or vector(0)) < 1'
    return _alert(
        inv,
        "OpsctlRouterNoHealthyWorkers",
        expr,
        inv.monitoring.service_down_for,
        "critical",
        f"router {router.name}: none of its {len(router.workers)} workers answers /metrics",
        {"router": router.name},
    )


def alert_rules(inv: Inventory) -> dict[str, Any]:
    m = inv.monitoring
    who = "{{ $labels.host }}/{{ $labels.service }}"
    rules = [
        _alert(
            inv,
            "OpsctlServiceDown",
            f'up{{job="{SERVICES_JOB}"}} == 0',
            m.service_down_for,
            "critical",
            f"{who} does not answer /metrics",
        ),
        _alert(
            inv,
            "OpsctlRouterDown",
            f'up{{job="{ROUTERS_JOB}"}} == 0',
            m.service_down_for,
            "critical",
            "router {{ $labels.router }} does not answer /metrics",
        ),
        *(_router_alert(inv, r) for r in inv.routers),
        _alert(
            inv,
            "OpsctlTauDrop",
            f"opsctl:ddtree_tau:rate5m < {m.tau_ratio!r} * opsctl:ddtree_tau:trailing",
            m.tau_for,
            "warning",
            f'{who}: tau {{{{ $value | printf "%.2f" }}}} is below {m.tau_ratio!r} of its trailing level',
        ),
        _alert(
            inv,
            "OpsctlTreeMostlyFallback",
            f"(opsctl:ddtree_fallback_share:rate10m > {m.fallback_share!r}) "
            f'and on ({BY}) up{{job="{SERVICES_JOB}", mode="tree"}}',
            m.fallback_for,
            "warning",
            f"{who}: a tree service runs DFLASH's chain verify in most decode rounds",
        ),
        _alert(
            inv,
            "OpsctlSelfCheckDisagreement",
            "max by (host, service) (ddtree_selfcheck_failed) > 0",
            0,
            "critical",
            f"{who}: a self-check found the tree verify differs from the chain verify",
        ),
        _alert(
            inv,
            "OpsctlTTFTHigh",
            f"opsctl:ttft_seconds:p95_5m > {m.ttft_p95!r}",
            m.ttft_for,
            "warning",
            f"{who}: p95 time to first token {{{{ $value | humanizeDuration }}}} is over {m.ttft_p95!r}s",
        ),
    ]
    return {"groups": [{"name": "opsctl-alerts", "interval": _seconds(m.scrape_interval), "rules": rules}]}
