"""`opsctl status` facts for one service: unit state, current release (mode, time, runtime), health, and the
last DDTREE metrics. Reads only."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from opsctl import health, metrics, modelcheck
from opsctl.commands import Cmd, sh
from opsctl.deploy import release
from opsctl.deploy.gate import UnitState, parse_show, show_cmd
from opsctl.errors import OpsctlError
from opsctl.inventory.model import Host as InvHost
from opsctl.inventory.model import ModelSourceKind, Service
from opsctl.ops import model_restore
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
    models: list[str] = field(default_factory=list)  # one line per model problem, with the command that fixes it
    models_ok: bool = True  # every model whole and the same the running process started with
    incomplete_releases: list[str] = field(default_factory=list)  # staged, never finished, not marked BAD
    error: str | None = None


def last_ddtree_cmd(unit: str) -> Cmd:
    return sh(
        f"journalctl -u {unit} --no-pager -o cat -n 20000 | grep -E 'DDTREE (init|metrics) ' | tail -n 50 || true",
        sudo=True,
    )


def collect(conn: Host, inv_host: InvHost, service: Service, http: httpx.Client, deep: bool = False) -> ServiceStatus:
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
    verdicts = modelcheck.check(conn, service, paths.unit_name, deep=deep)
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
        missing_models=[v.path for v in verdicts if v.problem is modelcheck.Problem.MISSING],
        models=[_model_line(v, inv_host, service) for v in verdicts if v.problem is not None],
        models_ok=all(v.ok for v in verdicts),
        incomplete_releases=[
            r.release_id for r in facts.releases if not r.complete and not r.bad and r.release_id != facts.current
        ],
    )


def _model_line(verdict: modelcheck.ModelVerdict, inv_host: InvHost, service: Service) -> str:
    spec = next(m for m in (service.model, service.draft_model) if m is not None and m.path.rstrip("/") == verdict.path)
    restore = model_restore.unit_name(spec) if spec.source_on is ModelSourceKind.HOST else None
    return f"{modelcheck.describe(verdict)}: {modelcheck.fix_hint(verdict, inv_host.name, service.name, restore)}"
