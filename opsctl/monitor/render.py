"""Every file of `opsctl monitor render`, as (relative path, text): pure, no host is contacted.

```
prometheus.yml                      scrape configuration: jobs opsctl-services and opsctl-routers (file_sd)
targets/services/<host>.<svc>.json  one target per service: labels host, service, worker, mode, engine, model
targets/routers/<router>.json       one target per router (its Prometheus port): labels host, router
rules/recording.yml                 opsctl:* series (opsctl.monitor.rules)
rules/alerts.yml                    alerts, with runbook links
grafana/opsctl-fleet.json           the dashboard (opsctl.monitor.dashboard)
```

Target files are named `<host>.<service>.json`: names hold no `.` (inventory rules), so no two services share a
file. The router job relabels the router's own `worker` label (a worker's URL) to the inventory's `host/service`,
keeping the URL as `worker_url`: `worker` means one thing on every series.

Target files are JSON (file_sd reads JSON or YAML), rules YAML through yaml.safe_dump: no value is pasted into
text. No secret is needed or written: SGLang's and the reference server's /metrics need no API key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

from opsctl.inventory.model import Host, Inventory, Router, Service
from opsctl.monitor.rules import ROUTERS_JOB, SERVICES_JOB, alert_rules, recording_rules
from opsctl.router.render import worker_urls

WILDCARD = ("0.0.0.0", "::", "")
LOOPBACK = ("127.", "::1", "localhost")
RULE_FILES = ("rules/recording.yml", "rules/alerts.yml")


@dataclass(frozen=True)
class MonitorFile:
    path: str  # relative to the output directory
    text: str


def _address(host: Host, bind: str) -> str:
    """Where Prometheus reaches a server bound to `bind` on `host`: the host's address unless it listens on
    one other address."""
    if bind in WILDCARD or bind.startswith(LOOPBACK):
        return host.address
    return bind


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def service_target(host: Host, svc: Service) -> list[dict[str, Any]]:
    labels = {
        "host": host.name,
        "service": svc.name,
        "worker": f"{host.name}/{svc.name}",
        "mode": svc.mode.value,
        "engine": svc.engine.value,
        "model": svc.served_model_name or svc.model.name,
    }
    return [{"targets": [_hostport(_address(host, svc.bind), svc.port)], "labels": labels}]


def router_target(inv: Inventory, router: Router) -> list[dict[str, Any]]:
    host = inv.host(router.host)
    labels = {"host": host.name, "router": router.name}
    return [{"targets": [_hostport(_address(host, router.bind), router.prometheus_port)], "labels": labels}]


def _escape_regex(text: str) -> str:
    return "".join(f"\\{c}" if c in ".[]()+*?^$|{}\\" else c for c in text)


def router_relabels(inv: Inventory) -> list[dict[str, Any]]:
    """metric_relabel_configs of the router job: the router's `worker` (a URL) -> `worker_url`, and `worker` set to
    the inventory's `host/service` of that URL (absent for a URL the inventory does not know)."""
    relabels: list[dict[str, Any]] = [
        {"source_labels": ["worker"], "regex": "(.+)", "target_label": "worker_url", "replacement": "$1"},
        {"action": "labeldrop", "regex": "worker"},
    ]
    known: dict[str, str] = {}
    for router in inv.routers:
        for ref, url in zip(router.workers, worker_urls(inv, router), strict=True):
            known[url] = f"{ref.host}/{ref.service}"
    for url, worker in sorted(known.items()):
        relabels.append({
            "source_labels": ["worker_url"], "regex": _escape_regex(url) + "/?",
            "target_label": "worker", "replacement": worker,
        })  # fmt: skip
    return relabels


def prometheus_config(inv: Inventory) -> dict[str, Any]:
    every = f"{inv.monitoring.scrape_interval}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every},
        "rule_files": list(RULE_FILES),
        "scrape_configs": [
            {
                "job_name": SERVICES_JOB,
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": ["targets/services/*.json"], "refresh_interval": "30s"}],
            },
            {
                "job_name": ROUTERS_JOB,
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": ["targets/routers/*.json"], "refresh_interval": "30s"}],
                "metric_relabel_configs": router_relabels(inv),
            },
        ],
    }


def _yaml(data: Any) -> str:
    return "# rendered by opsctl monitor render from the inventory; edit the inventory, not this file\n" + (
        yaml.safe_dump(data, sort_keys=False, width=200)
    )


def _json(data: Any) -> str:
    return json.dumps(data, indent=2) + "\n"


def render_monitoring(inv: Inventory) -> list[MonitorFile]:
    files = [MonitorFile("prometheus.yml", _yaml(prometheus_config(inv)))]
    files += [
        MonitorFile(f"targets/services/{h.name}.{s.name}.json", _json(service_target(h, s)))
        for h in inv.hosts
        for s in h.services
    ]
    files += [MonitorFile(f"targets/routers/{r.name}.json", _json(router_target(inv, r))) for r in inv.routers]
    files += [
        MonitorFile(RULE_FILES[0], _yaml(recording_rules(inv))),
        MonitorFile(RULE_FILES[1], _yaml(alert_rules(inv))),
        MonitorFile("grafana/opsctl-fleet.json", _json(dashboard())),
    ]
    return files


def dashboard() -> dict[str, Any]:
    """opsctl.monitor.dashboard's JSON model, imported on first use: Grafana's SDK takes ~0.1 s to import, which
    every other opsctl command (the CLI registers this module's command at start) need not pay."""
    from opsctl.monitor.dashboard import dashboard as build

    return build()
