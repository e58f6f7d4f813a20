"""`opsctl status` facts for one service: unit state, current release (mode, time, runtime), health, and the
last DDTREE metrics. Reads only."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from opsctl import health, metrics
from opsctl.commands import Cmd, sh
from opsctl.deploy import release
from opsctl.deploy.gate import UnitState, parse_show, show_cmd
from opsctl.errors import OpsctlError
from opsctl.inventory.model import Host as InvHost
from opsctl.inventory.model import Service
from opsctl.remote.base import Host


@dataclass(frozen=True)
class ServiceStatus:
    host: str
    service: str
    unit: UnitState | None
    current: str | None
    mode: str | None  # from the current release's manifest (what runs), not the inventory
    released_at: str | None
    runtime_version: str | None
    releases: int
    bad_releases: int
    rollback_to: str | None  # the release `opsctl rollback` would restore
    health: str  # "HTTP 200 in 3 ms", "connection refused", ...
    healthy: bool
    last_metrics: metrics.DDTreeMetrics | None
    init: metrics.DDTreeInit | None
    missing_models: list[str] = field(default_factory=list)  # model dirs not on the host (reboot: /dev/shm empty)
    error: str | None = None


def last_ddtree_cmd(unit: str) -> Cmd:
    return sh(
        f"journalctl -u {unit} --no-pager -o cat -n 20000 | grep -E 'DDTREE (init|metrics) ' | tail -n 50 || true",
        sudo=True,
    )


def collect(conn: Host, inv_host: InvHost, service: Service, http: httpx.Client) -> ServiceStatus:
    paths = release.ServicePaths(service.name)
    unit = parse_show(conn.run(show_cmd(paths.unit_name)).stdout)
    facts = release.parse_release_facts(conn.run(release.facts_cmd(paths)).stdout)
    manifest: release.Manifest | None = None
    if facts.current:
        try:
            manifest = release.Manifest.from_json(conn.get_text(f"{paths.release(facts.current)}/{release.MANIFEST}"))
        except OpsctlError:
            manifest = None
    probe = health.probe(http, health.health_url(inv_host, service), timeout=5.0)
    journal = conn.run(last_ddtree_cmd(paths.unit_name), check=False).stdout
    summary = metrics.summarize(metrics.parse_lines(journal.splitlines()))
    return ServiceStatus(
        host=inv_host.name,
        service=service.name,
        unit=unit,
        current=facts.current,
        mode=manifest.mode if manifest else None,
        released_at=manifest.created_at if manifest else None,
        runtime_version=manifest.runtime_version if manifest else None,
        releases=len(facts.releases),
        bad_releases=sum(1 for r in facts.releases if r.bad),
        rollback_to=facts.rollback_target(),
        health=probe.describe(),
        healthy=probe.ok,
        last_metrics=summary.last_metrics,
        init=summary.init,
        missing_models=release.missing_models(conn, service),
    )
