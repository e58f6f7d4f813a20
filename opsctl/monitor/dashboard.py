"""The Grafana dashboard (JSON model) for an inventory: one row per service, SGLang's panels (tok/s, TTFT and
ITL quantiles, running and queued requests) beside the tree's (tau, tree nodes / depth / width, phase times,
decode rounds by kind, the policy's shape), all on the `datasource` variable (a Prometheus data source)."""

from __future__ import annotations

from typing import Any

from opsctl.inventory.model import Inventory, Service

SCHEMA_VERSION = 39
UID = "opsctl-fleet"
PANEL_W, PANEL_H = 8, 8


def _sel(host: str, service: str) -> str:
    return f'host="{host}", service="{service}"'


def _panels(host: str, svc: Service) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(title, unit, [(expr, legend)]) per panel of one service."""
    sel = _sel(host, svc.name)

    def q(series: str, legend: str) -> tuple[str, str]:
        return f"{series}{{{sel}}}", legend

    panels = [
        (
            "tok/s",
            "short",
            [q("opsctl:tok_s:rate1m", "generated"), q("opsctl:ddtree_tok_s:rate5m", "decoding (DDTREE)")],
        ),
        ("TTFT", "s", [q("opsctl:ttft_seconds:p50_5m", "p50"), q("opsctl:ttft_seconds:p95_5m", "p95")]),
        ("inter-token latency", "s", [q("opsctl:itl_seconds:p50_5m", "p50"), q("opsctl:itl_seconds:p95_5m", "p95")]),
        ("requests", "short", [q("sglang:num_running_reqs", "running"), q("sglang:num_queue_reqs", "queued")]),
    ]
    if not svc.mode.ddtree:
        return panels

    def mean(name: str) -> str:
        return f"sum(rate({name}_sum{{{sel}}}[5m])) / sum(rate({name}_count{{{sel}}}[5m]))"

    rounds = f"scalar(sum(rate(ddtree_rounds_total{{{sel}}}[5m])))"
    phases = f"1000 * sum by (phase) (rate(ddtree_phase_seconds_total{{{sel}}}[5m])) / {rounds}"
    kinds = f"sum by (kind, reason) (rate(ddtree_decode_rounds_total{{{sel}}}[5m]))"
    off_spine = f"rate(ddtree_off_spine_rounds_total{{{sel}}}[5m]) / rate(ddtree_rounds_total{{{sel}}}[5m])"
    panels += [
        ("tau", "short", [q("opsctl:ddtree_tau:rate5m", "tau"), q("opsctl:ddtree_tau:trailing", "trailing")]),
        ("tree shape", "short", [(mean(f"ddtree_tree_{k}"), k) for k in ("nodes", "depth", "width")]),
        ("round phases (ms per round)", "ms", [(phases, "{{phase}}")]),
        ("decode rounds by kind", "short", [(kinds, "{{kind}} {{reason}}")]),
        ("off-spine, self-check", "short", [(off_spine, "off-spine"), q("ddtree_selfcheck_failed", "self-check")]),
        ("policy shape (budget; 0 = chain)", "short", [q("ddtree_policy_shape_budget", "batch {{bucket}}")]),
    ]  # fmt: skip
    return panels


def dashboard(inv: Inventory) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    next_id = 1
    y = 0
    for host in inv.hosts:
        for svc in host.services:
            panels.append({
                "id": next_id, "type": "row", "title": f"{host.name}/{svc.name} ({svc.mode.value}, {svc.engine.value})",
                "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": [],
            })  # fmt: skip
            next_id += 1
            y += 1
            for i, (title, unit, exprs) in enumerate(_panels(host.name, svc)):
                panels.append({
                    "id": next_id,
                    "type": "timeseries",
                    "title": title,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"h": PANEL_H, "w": PANEL_W, "x": (i % 3) * PANEL_W, "y": y + (i // 3) * PANEL_H},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
                    "targets": [
                        {"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend}
                        for k, (expr, legend) in enumerate(exprs)
                    ],
                })  # fmt: skip
                next_id += 1
            y += ((len(_panels(host.name, svc)) + 2) // 3) * PANEL_H
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
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                    "current": {},
                    "hide": 0,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }
