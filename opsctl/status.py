"""`opsctl status` facts for one service: unit state, current release (mode, time, runtime), health, and the
DDTREE metrics (from the service's /metrics where it has the `ddtree_*` series, else the journal's last metrics
line). Reads only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

import httpx

from opsctl import health, metrics, promtext, systemd
from opsctl.deploy import drift, lock, release
from opsctl.errors import OpsctlError
from opsctl.facts import modelcheck
from opsctl.inventory.model import Host, ModelSourceKind, ModelSpec, Service
from opsctl.remote.base import Connect, Connection
from opsctl.remote.pool import HostOutcome, run_parallel


class MetricsSource(StrEnum):
    """Where `ServiceStatus.last_metrics` comes from."""

    PROMETHEUS = "/metrics"  # the service's ddtree_* series: means since the process started
    JOURNAL = "journal"  # the last `DDTREE metrics` line: means over its window


def last_metrics(
    scrape: promtext.Scrape, summary: metrics.MetricsSummary
) -> tuple[metrics.DDTreeMetrics | None, MetricsSource]:
    """The service's DDTREE numbers from its /metrics where that carries the `ddtree_*` series (one source of
    truth: SGLang with --enable-metrics, the reference server), else from the journal's last metrics line."""
    if scrape.total("ddtree_rounds_total") is None:
        return summary.last_metrics, MetricsSource.JOURNAL
    return metrics.from_scrape(scrape), MetricsSource.PROMETHEUS


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
    metrics_source: MetricsSource = MetricsSource.JOURNAL  # where last_metrics comes from
    missing_models: list[str] = field(default_factory=list)  # model dirs not on the host (reboot: /dev/shm empty)
    models: list[str] = field(default_factory=list)  # one line per model problem, with the command that fixes it
    models_ok: bool = True  # every model whole and the same the running process started with
    incomplete_releases: list[str] = field(default_factory=list)  # staged, never finished, not marked BAD
    lock: str | None = None  # the host's deploy lock: holder, age, STALE when its process is gone
    lock_stale: bool = False  # held by a process that is gone: every deploy to the host is refused
    drift: list[str] = field(default_factory=list)  # files of the current release (or the rollback target) changed
    gates_pending: bool = False  # current went live and its gates never finished (never tested)
    error: str | None = None

    @property
    def deploying(self) -> bool:
        """A deploy holds the host's lock now (its process alive, or not known to be gone): a restart and a release
        whose gates have not finished are what it is doing, not an outage or an interrupted deploy."""
        return self.lock is not None and not self.lock_stale

    @property
    def failing(self) -> bool:
        """Whether this row makes `status` exit non-zero: not serving, a model problem, a stale lock, drift, or a
        release whose gates never finished (the last two only while no deploy runs on the host)."""
        busy = self.deploying
        return (
            (not self.healthy and not busy)
            or not self.models_ok
            or self.lock_stale
            or bool(self.drift)
            or (self.gates_pending and not busy)
        )


def collect(conn: Connection, host: Host, service: Service, http: httpx.Client, deep: bool = False) -> ServiceStatus:
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
    scrape = health.scrape(http, health.metrics_url(host, service)) if probe.ok else promtext.Scrape({}, error="down")
    last, source = last_metrics(scrape, summary)
    verdicts = modelcheck.check(conn, service, paths.unit_name, deep=deep, host=host)
    failed = _failed_restores(conn, service, verdicts)
    changed = drift.status_lines(conn, paths, facts)
    held, stale = lock.held_now(conn, datetime.now(UTC))
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
        last_metrics=last,
        metrics_source=source,
        init=summary.init,
        missing_models=[v.path for v in verdicts if v.problem is modelcheck.Problem.MISSING],
        models=[_model_line(v, host, service, failed) for v in verdicts if v.problem is not None],
        models_ok=all(v.ok for v in verdicts),
        incomplete_releases=[
            r.release_id for r in facts.releases if not r.complete and not r.bad and r.release_id != facts.current
        ],
        lock=held,
        lock_stale=stale,
        drift=changed,
        gates_pending=facts.current_pending,
    )


def _spec(service: Service, verdict: modelcheck.ModelVerdict) -> ModelSpec:
    return next(m for m in (service.model, service.draft_model) if m is not None and m.path.rstrip("/") == verdict.path)


def _failed_restores(
    conn: Connection, service: Service, verdicts: list[modelcheck.ModelVerdict]
) -> dict[str, str]:  # fmt: skip
    """Restore unit -> its result, for the missing host-side models whose restore unit failed."""
    missing = [v for v in verdicts if v.problem is modelcheck.Problem.MISSING]
    return modelcheck.failed_restore_units(conn, [_spec(service, v) for v in missing])


def _model_line(verdict: modelcheck.ModelVerdict, host: Host, service: Service, failed: dict[str, str]) -> str:
    spec = _spec(service, verdict)
    restore = modelcheck.restore_unit(spec) if spec.source_on is ModelSourceKind.HOST else None
    hint = modelcheck.fix_hint(verdict, host.name, service.name, restore, failed.get(restore or "", ""))
    return f"{modelcheck.describe(verdict)}: {hint}"


def collect_all(
    selection: Sequence[tuple[Host, Sequence[Service]]], connect: Connect, forks: int = 16, deep: bool = False
) -> list[HostOutcome[list[ServiceStatus]]]:
    """`collect` for every selected service, one connection per host, hosts in parallel."""

    def one(item: tuple[Host, Sequence[Service]]) -> list[ServiceStatus]:
        h, svcs = item
        conn = connect(h)
        try:
            with httpx.Client() as http:
                return [collect(conn, h, s, http, deep=deep) for s in svcs]
        finally:
            conn.close()

    return run_parallel(selection, key=lambda item: item[0].name, fn=one, forks=forks)
