"""The Grafana dashboard (JSON model), one for any fleet: its size does not grow with the inventory.

Variables: `datasource` (a Prometheus data source), then `host`, `mode`, `model`, `service` and `worker`, each
read from the `up` series of the services' scrape job (`label_values`), multi-select with `All`. Rows:

- fleet: targets up and down, total tok/s, requests running and queued, alerts firing, tau per service (a table
  sorted by tau), the share of requests aborted and KV cache usage per service;
- routers: each router's healthy workers (its own view), answers per second by status, the 5xx share;
- one row per selected `worker` (Grafana repeats it): SGLang's panels (tok/s, TTFT and ITL quantiles, running and
  queued requests) beside the tree's (tau, with SGLang's own accept length for `linear` services; tree shape,
  phase times, decode rounds by kind, off-spine share and self-check, the policy's shape; empty for a service that
  runs no DDTREE).

Written as plain dicts: Grafana's `grafana-foundation-sdk` was weighed and not taken (docs/monitoring.md says
why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opsctl.monitor.rules import ROUTERS_JOB, SERVICES_JOB

SCHEMA_VERSION = 39
UID = "opsctl-fleet"
PANEL_W, PANEL_H = 8, 8
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# what every fleet query filters on: the variables, over the labels every service series carries
FLEET = 'host=~"$host", service=~"$service", mode=~"$mode", model=~"$model"'
ONE = 'worker="$worker"'  # inside a repeated row: that row's service


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[tuple[str, str], ...]  # (expr, legend)
    kind: str = "timeseries"  # or "stat", "table"
    options: dict[str, Any] = field(default_factory=dict)


def _variable(name: str, label: str, parents: str) -> dict[str, Any]:
    query = f'label_values(up{{job="{SERVICES_JOB}"{parents}}}, {name})'
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"var-{name}"}, "definition": query,
        "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0,
    }  # fmt: skip


def variables() -> list[dict[str, Any]]:
    source = {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}
    chain = [("host", "host", ""), ("mode", "mode", ', host=~"$host"'), ("model", "model", ', mode=~"$mode"')]
    chain += [
        ("service", "service", ', host=~"$host", mode=~"$mode", model=~"$model"'),
        ("worker", "service (host/service)", f", {FLEET}"),
    ]
    return [{**source, "current": {}, "hide": 0}, *(_variable(*spec) for spec in chain)]


def fleet_panels() -> list[Panel]:
    up = f'up{{job="{SERVICES_JOB}", {FLEET}}}'
    tau = f"sort_desc(opsctl:ddtree_tau:rate{{{FLEET}}})"
    table = {"options": {"showHeader": True, "sortBy": [{"displayName": "Value", "desc": True}]}}
    return [
        Panel("targets up / down", "short", ((f"sum({up})", "up"), (f"count({up} == 0) or vector(0)", "down")), "stat"),
        Panel("tok/s (selected services)", "short", ((f"sum(opsctl:tok_s:rate{{{FLEET}}})", "generated"),), "stat"),
        Panel("requests running / queued", "short", (
            (f"sum(sglang:num_running_reqs{{{FLEET}}})", "running"),
            (f"sum(sglang:num_queue_reqs{{{FLEET}}})", "queued"),
        )),
        Panel("alerts firing", "short", (
            ('count by (alertname) (ALERTS{alertstate="firing", alertname=~"Opsctl.*"})', "{{alertname}}"),
        ), "stat"),
        Panel("tau per service", "short", ((tau, "{{worker}}"),), "table", table),
        Panel("requests aborted (share)", "percentunit", ((f"opsctl:request_errors:ratio{{{FLEET}}}", "{{worker}}"),)),
        Panel("KV cache usage", "percentunit", ((f"sglang:token_usage{{{FLEET}}}", "{{worker}}"),)),
        Panel("TTFT p95", "s", ((f"opsctl:ttft_seconds:p95{{{FLEET}}}", "{{worker}}"),)),
        Panel("tok/s per service", "short", ((f"opsctl:tok_s:rate{{{FLEET}}}", "{{worker}}"),)),
    ]  # fmt: skip


def router_panels() -> list[Panel]:
    job = f'job="{ROUTERS_JOB}"'
    healthy = f"sum by (router) (smg_worker_health{{{job}}})"
    answers = f"sum by (router, status_code) (rate(smg_http_responses_total{{{job}}}[$__rate_interval]))"
    return [
        Panel("healthy workers (router's view)", "short", ((healthy, "{{router}}"),)),
        Panel("answers per second by status", "reqps", ((answers, "{{router}} {{status_code}}"),)),
        Panel("5xx share", "percentunit", (("opsctl:router_errors:ratio", "{{router}}"),)),
    ]


def service_panels() -> list[Panel]:
    def q(series: str, legend: str) -> tuple[str, str]:
        return f"{series}{{{ONE}}}", legend

    def mean(name: str) -> str:
        return f"sum(rate({name}_sum{{{ONE}}}[$__rate_interval])) / sum(rate({name}_count{{{ONE}}}[$__rate_interval]))"

    def rate(series: str) -> str:
        return f"rate({series}{{{ONE}}}[$__rate_interval])"

    rounds = f"scalar(sum({rate('ddtree_rounds_total')}))"
    return [
        Panel("tok/s", "short", (q("opsctl:tok_s:rate", "generated"), q("opsctl:ddtree_tok_s:rate", "decoding"))),
        Panel("TTFT", "s", (q("opsctl:ttft_seconds:p50", "p50"), q("opsctl:ttft_seconds:p95", "p95"))),
        Panel("inter-token latency", "s", (q("opsctl:itl_seconds:p50", "p50"), q("opsctl:itl_seconds:p95", "p95"))),
        Panel("requests", "short", (q("sglang:num_running_reqs", "running"), q("sglang:num_queue_reqs", "queued"))),
        Panel("tau", "short", (
            q("opsctl:ddtree_tau:rate", "tau"), q("opsctl:ddtree_tau:baseline", "baseline"),
            q("sglang:spec_accept_length", "SGLang accept length"),  # a `linear` service's tau: no ddtree_* series
        )),
        Panel("tree shape", "short", tuple((mean(f"ddtree_tree_{k}"), k) for k in ("nodes", "depth", "width"))),
        Panel("round phases (ms per round)", "ms", (
            (f"1000 * sum by (phase) ({rate('ddtree_phase_seconds_total')}) / {rounds}", "{{phase}}"),
        )),
        Panel("decode rounds by kind", "short", (
            (f"sum by (kind, reason) ({rate('ddtree_decode_rounds_total')})", "{{kind}} {{reason}}"),
        )),
        Panel("off-spine, self-check", "short", (
            (f"{rate('ddtree_off_spine_rounds_total')} / {rate('ddtree_rounds_total')}", "off-spine"),
            q("ddtree_selfcheck_failed", "self-check"),
        )),
        Panel("policy shape (budget; 0 = chain)", "short", (q("ddtree_policy_shape_budget", "batch {{bucket}}"),)),
    ]  # fmt: skip


def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    instant = panel.kind != "timeseries"
    return {
        "id": panel_id, "type": panel.kind, "title": panel.title, "datasource": DATASOURCE,
        "gridPos": {"h": PANEL_H, "w": PANEL_W, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
        "targets": [
            {"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend, "datasource": DATASOURCE,
             "instant": instant, "range": not instant, **({"format": "table"} if panel.kind == "table" else {})}
            for k, (expr, legend) in enumerate(panel.targets)
        ],
        **panel.options,
    }  # fmt: skip


def dashboard() -> dict[str, Any]:
    sections: list[tuple[str, str | None, list[Panel]]] = [
        ("fleet", None, fleet_panels()),
        ("routers", None, router_panels()),
        ("$worker", "worker", service_panels()),
    ]
    panels: list[dict[str, Any]] = []
    y = 0
    for title, repeat, members in sections:
        row: dict[str, Any] = {
            "id": len(panels) + 1, "type": "row", "title": title, "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": [],
        }  # fmt: skip
        if repeat is not None:
            row["repeat"] = repeat
        panels.append(row)
        y += 1
        for i, panel in enumerate(members):
            x, dy = (i % 3) * PANEL_W, (i // 3) * PANEL_H
            panels.append(_panel_json(panel, len(panels) + 1, x, y + dy))
        y += ((len(members) + 2) // 3) * PANEL_H
    return {
        "uid": UID,
        "title": "opsctl fleet",
        "tags": ["opsctl", "sglang", "ddtree"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "templating": {"list": variables()},
        "annotations": {"list": []},
        "panels": panels,
    }
