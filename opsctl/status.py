"""`opsctl status` facts for one service: unit state, current release (mode, time, runtime), health, and the
last DDTREE metrics. Reads only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from opsctl import health, metrics, systemd
from opsctl.deploy import release
from opsctl.errors import OpsctlError
from opsctl.inventory.model import Host, Service
from opsctl.remote.base import Connect, Connection
from opsctl.remote.pool import HostOutcome, run_parallel


@dataclass(frozen=True)
class ServiceStatus:
    host: str
    service: str
    unit: systemd.UnitState | None
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


def collect(conn: Connection, host: Host, service: Service, http: httpx.Client) -> ServiceStatus:
    paths = release.ServicePaths(service.name)
    unit = systemd.parse_show(conn.run(systemd.show_cmd(paths.unit_name)).stdout)
    facts = release.parse_release_facts(conn.run(release.facts_cmd(paths)).stdout)
    manifest: release.Manifest | None = None
    if facts.current:
        try:
            manifest = release.Manifest.from_json(conn.get_text(f"{paths.release(facts.current)}/{release.MANIFEST}"))
        except OpsctlError:
            manifest = None
    probe = health.probe(http, health.health_url(host, service), timeout=5.0)
    journal = conn.run(systemd.ddtree_lines_cmd(paths.unit_name), check=False).stdout
    summary = metrics.summarize(metrics.parse_lines(journal.splitlines()))
    return ServiceStatus(
        host=host.name,
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


def collect_all(
    selection: Sequence[tuple[Host, Sequence[Service]]], connect: Connect, forks: int = 16
) -> list[HostOutcome[list[ServiceStatus]]]:
    """`collect` for every selected service, one connection per host, hosts in parallel."""

    def one(item: tuple[Host, Sequence[Service]]) -> list[ServiceStatus]:
        h, svcs = item
        conn = connect(h)
        try:
            with httpx.Client() as http:
                return [collect(conn, h, s, http) for s in svcs]
        finally:
            conn.close()

    return run_parallel(selection, key=lambda item: item[0].name, fn=one, forks=forks)
