"""Prometheus recording and alert rules for an inventory, as values (dicts that YAML-dump to a rule file).

Label values come from the inventory, where host, service and router names are safe names (lowercase letters,
digits, `-`, `_`), so they go into PromQL selectors and regexes as they are; thresholds are validated numbers
(opsctl.inventory.monitoring) printed with `repr`. Alert annotations name the runbook's anchor for the alert.

Windows follow the scrape interval: a `rate` needs two samples in its window, so every window is at least four
scrape intervals (`windows`); at the default 15 s they are 1, 5 and 10 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opsctl.inventory.model import Inventory

SERVICES_JOB = "opsctl-services"
ROUTERS_JOB = "opsctl-routers"
# a service's identity labels, all set by its file_sd target and constant per target: aggregating by all of them
# splits nothing, and keeps what the dashboard's variables filter on (mode, model)
BY = "host, service, worker, mode, engine, model"
ROUTER_BY = "host, router"
DFLASH_ROUNDS = 'ddtree_decode_rounds_total{kind="dflash"}'
ROUTER_ANSWERS = f'smg_http_responses_total{{job="{ROUTERS_JOB}"}}'  # what the router answered its clients
ROUTER_5XX = f'smg_http_responses_total{{job="{ROUTERS_JOB}", status_code=~"5.."}}'
MIN_SAMPLES = 4  # scrape intervals in every window

# alert -> the runbook's anchor (docs/runbook.md, "Monitoring alerts")
RUNBOOK_ANCHORS = {
    "OpsctlServiceDown": "opsctlservicedown",
    "OpsctlRouterDown": "opsctlrouterdown",
    "OpsctlRouterNoHealthyWorkers": "opsctlrouternohealthyworkers",
    "OpsctlRouterErrors": "opsctlroutererrors",
    "OpsctlRequestErrors": "opsctlrequesterrors",
    "OpsctlQueueGrowing": "opsctlqueuegrowing",
    "OpsctlKVCacheFull": "opsctlkvcachefull",
    "OpsctlTauDrop": "opsctltaudrop",
    "OpsctlTreeMostlyFallback": "opsctltreemostlyfallback",
    "OpsctlSelfCheckDisagreement": "opsctlselfcheckdisagreement",
    "OpsctlTTFTHigh": "opsctlttfthigh",
}


def _seconds(n: int) -> str:
    return f"{n}s"


@dataclass(frozen=True)
class Windows:
    """Range windows in seconds: `short` for tok/s, `mid` for tau, quantiles and error ratios, `long` for
    shares and trends."""

    short: int
    mid: int
    long: int


def windows(scrape_interval: int) -> Windows:
    floor = MIN_SAMPLES * scrape_interval
    return Windows(max(60, floor), max(300, floor), max(600, floor))


def recording_rules(inv: Inventory) -> dict[str, Any]:
    """Per service (`BY`): tok/s, tau with its trailing level and baseline, TTFT / ITL quantiles, the share of
    decode rounds that ran DFLASH's chain verify instead of a tree, the share of requests aborted; per router
    (`ROUTER_BY`): the share of answers that were 5xx."""
    m = inv.monitoring
    w = windows(m.scrape_interval)
    short, mid, long = (_seconds(n) for n in (w.short, w.mid, w.long))

    def rate(series: str, window: str, by: str = BY) -> str:
        return f"sum by ({by}) (rate({series}[{window}]))"

    def quantile(q: float, metric: str) -> str:
        return f"histogram_quantile({q}, sum by ({BY}, le) (rate({metric}_bucket[{mid}])))"

    rules = [
        ("opsctl:tok_s:rate", rate("sglang:generation_tokens_total", short)),
        (
            "opsctl:ddtree_tau:rate",
            f"{rate('ddtree_committed_tokens_total', mid)} / {rate('ddtree_rounds_total', mid)}",
        ),
        (
            "opsctl:ddtree_tok_s:rate",
            f"{rate('ddtree_committed_tokens_total', mid)} / {rate('ddtree_phase_seconds_total', mid)}",
        ),
        (
            "opsctl:ddtree_fallback_share:rate",
            f"{rate(DFLASH_ROUNDS, long)} / {rate('ddtree_decode_rounds_total', long)}",
        ),
        ("opsctl:ttft_seconds:p50", quantile(0.5, "sglang:time_to_first_token_seconds")),
        ("opsctl:ttft_seconds:p95", quantile(0.95, "sglang:time_to_first_token_seconds")),
        ("opsctl:itl_seconds:p50", quantile(0.5, "sglang:inter_token_latency_seconds")),
        ("opsctl:itl_seconds:p95", quantile(0.95, "sglang:inter_token_latency_seconds")),
        (
            "opsctl:request_errors:ratio",
            f"{rate('sglang:num_aborted_requests_total', mid)} / {rate('sglang:num_requests_total', mid)}",
        ),
        (
            "opsctl:router_errors:ratio",
            f"{rate(ROUTER_5XX, mid, ROUTER_BY)} / {rate(ROUTER_ANSWERS, mid, ROUTER_BY)}",
        ),
    ]
    trailing = [
        ("opsctl:ddtree_tau:trailing", f"avg_over_time(opsctl:ddtree_tau:rate[{_seconds(m.tau_trailing)}])"),
        # the highest trailing level over the last trailing period: a sustained drop pulls the trailing average
        # down with it, this keeps the level from before the drop for a whole period (evaluated after the line
        # above in the same group: rules of a group run in order, each seeing the ones before)
        ("opsctl:ddtree_tau:baseline", f"max_over_time(opsctl:ddtree_tau:trailing[{_seconds(m.tau_trailing)}])"),
    ]
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
                "rules": [{"record": name, "expr": expr} for name, expr in trailing],
            },
        ]
    }


def _alert(
    inv: Inventory, name: str, expr: str, for_s: int, severity: str, summary: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    url = f"{inv.monitoring.runbook}#{RUNBOOK_ANCHORS[name]}"
    rule: dict[str, Any] = {"alert": name, "expr": expr, "for": _seconds(for_s)}
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {"summary": summary, "runbook_url": url}
    return rule


def alert_rules(inv: Inventory) -> dict[str, Any]:
    m = inv.monitoring
    long = _seconds(windows(m.scrape_interval).long)
    who = "{{ $labels.host }}/{{ $labels.service }}"
    services = f'job="{SERVICES_JOB}"'
    routers = f'job="{ROUTERS_JOB}"'
    # the router's own view: its healthy workers (smg_worker_health), 0 when it lists none, for a router that
    # answers its scrape (a router that does not is OpsctlRouterDown)
    healthy = (
        f"(sum by ({ROUTER_BY}) (smg_worker_health{{{routers}}}) or sum by ({ROUTER_BY}) (0 * up{{{routers}}})) < 1 "
        f"and on ({ROUTER_BY}) sum by ({ROUTER_BY}) (up{{{routers}}}) == 1"
    )
    queued = f"sglang:num_queue_reqs{{{services}}}"
    rules = [
        _alert(
            inv, "OpsctlServiceDown", f"up{{{services}}} == 0", m.service_down_for, "critical",
            f"{who} does not answer /metrics",
        ),
        _alert(
            inv, "OpsctlRouterDown", f"up{{{routers}}} == 0", m.service_down_for, "critical",
            "router {{ $labels.router }} does not answer /metrics",
        ),
        _alert(
            inv, "OpsctlRouterNoHealthyWorkers", healthy, m.service_down_for, "critical",
            "router {{ $labels.router }} has no healthy worker: clients get errors",
        ),
        _alert(
            inv, "OpsctlRouterErrors", f"opsctl:router_errors:ratio > {m.error_ratio!r}", m.error_for, "critical",
            'router {{ $labels.router }}: {{ $value | humanizePercentage }} of answers are 5xx',
        ),
        _alert(
            inv, "OpsctlRequestErrors", f"opsctl:request_errors:ratio > {m.error_ratio!r}", m.error_for, "warning",
            f"{who}: {{{{ $value | humanizePercentage }}}} of requests aborted",
        ),
        _alert(
            inv, "OpsctlQueueGrowing",
            f"min by ({BY}) (min_over_time({queued}[{long}])) > 0 "
            f"and on ({BY}) max by ({BY}) (deriv({queued}[{long}])) > 0",
            m.queue_for, "warning", f"{who}: requests queue and the queue keeps growing",
        ),
        _alert(
            inv, "OpsctlKVCacheFull", f"max by ({BY}) (sglang:token_usage{{{services}}}) > {m.kv_usage!r}",
            m.kv_for, "warning", f"{who}: KV cache {{{{ $value | humanizePercentage }}}} used",
        ),
        _alert(
            inv, "OpsctlTauDrop", f"opsctl:ddtree_tau:rate < {m.tau_ratio!r} * opsctl:ddtree_tau:baseline",
            m.tau_for, "warning",
            f'{who}: tau {{{{ $value | printf "%.2f" }}}} is below {m.tau_ratio!r} of its trailing level',
        ),
        _alert(
            inv, "OpsctlTreeMostlyFallback",
            f'opsctl:ddtree_fallback_share:rate{{mode="tree"}} > {m.fallback_share!r}',
            m.fallback_for, "warning", f"{who}: a tree service runs DFLASH's chain verify in most decode rounds",
        ),
        _alert(
            inv, "OpsctlSelfCheckDisagreement", f"max by ({BY}) (ddtree_selfcheck_failed) > 0", 0, "critical",
            f"{who}: a self-check found the tree verify differs from the chain verify",
        ),
        _alert(
            inv, "OpsctlTTFTHigh", f"opsctl:ttft_seconds:p95 > {m.ttft_p95!r}", m.ttft_for, "warning",
            f"{who}: p95 time to first token {{{{ $value | humanizeDuration }}}} is over {m.ttft_p95!r}s",
        ),
    ]  # fmt: skip
    return {"groups": [{"name": "opsctl-alerts", "interval": _seconds(m.scrape_interval), "rules": rules}]}
