"""The Grafana dashboard, one for any fleet: its size does not grow with the inventory.

Variables: `datasource` (a Prometheus data source), then `host`, `mode`, `model`, `service` and `worker`, each
read from the `up` series of the services' scrape job (`label_values`), multi-select with `All`. Rows:

- fleet: targets up and down, total tok/s, requests running and queued, alerts firing, tau per service (a table
  sorted by tau), the share of requests aborted and KV cache usage per service;
- routers: each router's healthy workers (its own view), answers per second by status, the 5xx share;
- one row per selected `worker` (Grafana repeats it): SGLang's panels (tok/s, TTFT and ITL quantiles, running and
  queued requests) beside the tree's (tau, with SGLang's own accept length for `linear` services; tree shape,
  phase times, decode rounds by kind, off-spine share and self-check, the policy's shape; empty for a service that
  runs no DDTREE).

What the panels show is plain data here (`Panel`: a title, a unit, PromQL queries); the JSON model is built with
Grafana's grafana-foundation-sdk, its typed builders of the Grafana 11.6 dashboard schema (the exact version is
pinned in pyproject.toml; docs/monitoring.md), whose layout puts the panels three to a line under each row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from opsctl.monitor.rules import ROUTERS_JOB, SERVICES_JOB

UID = "opsctl-fleet"
PANEL_W, PANEL_H = 8, 8  # three panels to a line of Grafana's 24 columns
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")

# what every fleet query filters on: the variables, over the labels every service series carries
FLEET = 'host=~"$host", service=~"$service", mode=~"$mode", model=~"$model"'
ONE = 'worker="$worker"'  # inside a repeated row: that row's service

PanelBuilder = timeseries.Panel | stat.Panel | table.Panel


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    targets: tuple[tuple[str, str], ...]  # (expr, legend)
    kind: Literal["timeseries", "stat", "table"] = "timeseries"  # stat and table show the last value (instant)


def _variable(name: str, label: str, parents: str) -> builders.QueryVariable:
    query = f'label_values(up{{job="{SERVICES_JOB}"{parents}}}, {name})'
    return (
        builders.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"var-{name}"})
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(text=["All"], value=["$__all"], selected=True))
    )


def variables() -> list[Builder[model.VariableModel]]:
    source = builders.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
    chain = [("host", "host", ""), ("mode", "mode", ', host=~"$host"'), ("model", "model", ', mode=~"$mode"')]
    chain += [
        ("service", "service", ', host=~"$host", mode=~"$mode", model=~"$model"'),
        ("worker", "service (host/service)", f", {FLEET}"),
    ]
    return [source, *(_variable(*spec) for spec in chain)]


def fleet_panels() -> list[Panel]:
    up = f'up{{job="{SERVICES_JOB}", {FLEET}}}'
    tau = f"sort_desc(opsctl:ddtree_tau:rate{{{FLEET}}})"
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
        Panel("tau per service", "short", ((tau, "{{worker}}"),), "table"),
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


def _panel(panel: Panel, panel_id: int) -> PanelBuilder:
    # Table and time series panels carry their custom field config whole (Grafana's defaults: align auto, line width
    # 1): the SDK's model reads one back with its defaults filled in, and the rendered file equals its read-back
    builder: PanelBuilder
    if panel.kind == "stat":
        builder = stat.Panel()
    elif panel.kind == "table":  # highest value first
        sort = common_builders.TableSortByFieldState().display_name("Value").desc(True)
        builder = table.Panel().show_header(True).sort_by([sort]).align(common.FieldTextAlignment.AUTO)
    else:
        legend = (
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        builder = timeseries.Panel().legend(legend).line_width(1)
    builder.id(panel_id).title(panel.title).datasource(DATASOURCE).unit(panel.unit).height(PANEL_H).span(PANEL_W)
    for k, (expr, legend_format) in enumerate(panel.targets):
        query = prometheus.Dataquery().ref_id(chr(ord("A") + k)).expr(expr).legend_format(legend_format)
        query.datasource(DATASOURCE)
        if panel.kind == "timeseries":
            query.range()
        else:
            query.instant()
        if panel.kind == "table":
            query.format(PromQueryFormat.TABLE)
        builder.with_target(query)
    return builder


def build() -> model.Dashboard:
    """The dashboard as the SDK's model: rows and panels in order, placed by the SDK's layout."""
    board = (
        builders.Dashboard("opsctl fleet")
        .uid(UID)
        .tags(["opsctl", "sglang", "ddtree"])
        .version(1)
        .editable()
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .variables(variables())
        .annotations([])
    )
    sections: list[tuple[str, str | None, list[Panel]]] = [
        ("fleet", None, fleet_panels()),
        ("routers", None, router_panels()),
        ("$worker", "worker", service_panels()),
    ]
    panel_id = 0
    for title, repeat, members in sections:
        panel_id += 1
        row = builders.Row(title).id(panel_id).collapsed(False)
        if repeat is not None:
            row.repeat(repeat)
        board.with_row(row)  # open: the panels after it, up to the next row, are its own
        for panel in members:
            panel_id += 1
            board.with_panel(_panel(panel, panel_id))
    return board.build()


def dashboard() -> dict[str, Any]:
    """The dashboard's JSON model (what Grafana imports), as plain data."""
    data: dict[str, Any] = json.loads(json.dumps(build(), cls=JSONEncoder))
    return data
