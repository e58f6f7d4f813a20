"""`opsctl deploy` and `opsctl rollback`: thin; the work is in opsctl.deploy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from opsctl import layout
from opsctl.cli.common import (
    ForksOpt,
    HostOpt,
    InventoryOpt,
    JsonOpt,
    ServiceOpt,
    console,
    emit_json,
    handle_errors,
    load_inventory,
    split_selector,
)
from opsctl.deploy import lock
from opsctl.deploy.flow import DeploySettings, ServiceResult
from opsctl.deploy.release import DEFAULT_KEEP
from opsctl.deploy.rollout import Outcome
from opsctl.deploy.runner import RolloutOptions, RunReport
from opsctl.errors import DeployError
from opsctl.inventory.load import Override
from opsctl.inventory.model import Host, Mode, Service
from opsctl.inventory.select import select
from opsctl.progress import Ticker
from opsctl.remote.base import Connect

ModeOpt = Annotated[
    Mode | None, typer.Option("--mode", help="Deploy the selected services in this mode (overrides the inventory).")
]

_STYLE = {
    Outcome.DEPLOYED: "green",
    Outcome.REVERTED: "green",
    Outcome.UNCHANGED: "dim",
    Outcome.PLANNED: "yellow",
    Outcome.SKIPPED: "dim",
}


def overrides(
    hosts: list[str] | None,
    services: list[str] | None,
    mode: Mode | None = None,
    health_timeout: float | None = None,
    readiness_delay: float | None = None,
) -> list[Override]:
    """Command-line changes to the selected services, applied to the inventory's data before validation."""
    scope = (tuple(hosts) if hosts else None, tuple(services) if services else None)
    given: list[tuple[str, str, object]] = []
    if mode is not None:
        given.append(("mode", f"--mode {mode.value}", mode.value))
    if health_timeout is not None:
        given.append(("health_timeout", f"--health-timeout {health_timeout:g}", health_timeout))
    if readiness_delay is not None:
        given.append(("readiness_delay", f"--readiness-delay {readiness_delay:g}", readiness_delay))
    return [Override(key, value, flag, *scope) for key, flag, value in given]


def _selection(
    inventory: Path,
    host: list[str] | None,
    service: list[str] | None,
    mode: Mode | None = None,
    health_timeout: float | None = None,
    readiness_delay: float | None = None,
) -> list[tuple[Host, list[Service]]]:
    hosts, services = split_selector(host), split_selector(service)
    inv = load_inventory(inventory, overrides(hosts, services, mode, health_timeout, readiness_delay))
    picked = select(inv, hosts, services)
    selection = [(h, svcs) for h, svcs in picked if svcs]
    if not selection:
        raise DeployError("no services selected", "the inventory's hosts have no services")
    return selection


def print_report(report: RunReport, as_json: bool, plan: bool = False) -> None:
    if as_json:
        emit_json(
            {
                "action": report.action,
                "interrupted": report.interrupted,
                "stopped_early": report.stopped_early,
                "failures": report.failures,
                "results": report.results,
            }
        )
    for r in report.results:
        _print_result(r, plan)
    if report.stopped_early:
        console.print("[bold red]rollout stopped:[/] failures exceeded --max-fail", markup=True)
    if report.interrupted:
        console.print("interrupted: locks released; previous releases serving")


def _print_result(r: ServiceResult, plan: bool) -> None:
    style = _STYLE.get(r.outcome, "bold red")
    console.print(f"[{style}]{r.host}/{r.service}: {r.outcome.value}[/] {r.message}", markup=True)
    for line in r.plan:
        console.print(f"    {line}", markup=False)
    if r.journal_tail:
        console.print(f"    --- journal tail of {layout.unit_name(r.service)} on {r.host} ---", markup=False)
        for line in r.journal_tail.splitlines():
            console.print(f"    {line}", markup=False)
    if r.timings and not plan:
        timing = " ".join(f"{k}={v:.1f}" for k, v in r.timings.items())
        console.print(f"    [dim]{timing}[/]", markup=True)


def register(app: typer.Typer) -> None:
    @app.command("deploy")
    @handle_errors
    def deploy(
        inventory: InventoryOpt,
        mode: ModeOpt = None,
        host: HostOpt = None,
        service: ServiceOpt = None,
        plan: Annotated[bool, typer.Option("--plan", help="Show what would change; change nothing.")] = False,
        canary: Annotated[bool, typer.Option("--canary", help="Deploy the first service alone first.")] = False,
        batch: Annotated[
            int | None, typer.Option("--batch", min=1, help="Services per batch after the canary.")
        ] = None,
        max_fail: Annotated[int, typer.Option("--max-fail", min=0, help="Stop when failures exceed this.")] = 0,
        lock_wait: Annotated[float, typer.Option("--lock-wait", min=0, help="Seconds to wait for a held lock.")] = 0,
        keep: Annotated[int, typer.Option("--keep", min=1, help="Releases kept per service.")] = DEFAULT_KEEP,
        force: Annotated[bool, typer.Option("--force", help="Deploy even if the config is unchanged.")] = False,
        no_smoke: Annotated[bool, typer.Option("--no-smoke", help="Skip the smoke gate.")] = False,
        health_timeout: Annotated[
            float | None, typer.Option("--health-timeout", help="Override the services' health_timeout (s).")
        ] = None,
        readiness_delay: Annotated[
            float | None, typer.Option("--readiness-delay", help="Override the services' readiness_delay (s).")
        ] = None,
        runtime_wheel: Annotated[
            Path | None, typer.Option("--runtime-wheel", help="A built ddtree-runtime wheel (default: build it).")
        ] = None,
        break_lock: Annotated[
            bool, typer.Option("--break-lock", help="Remove the selected hosts' deploy locks (stale) and exit.")
        ] = False,
        forks: ForksOpt = 16,
        as_json: JsonOpt = False,
    ) -> None:
        """Deploy a release per service: stage, verify, switch, restart, health + smoke gates, auto-rollback."""
        from opsctl.artifact import runtime_wheel as build_wheel
        from opsctl.deploy import runner

        selection = _selection(inventory, host, service, mode, health_timeout, readiness_delay)
        if break_lock:
            _break_locks(selection)
            return
        with Ticker("runtime wheel", out=lambda line: console.print(line, markup=False)):
            wheel = build_wheel(runtime_wheel)
        settings = DeploySettings(
            keep=keep,
            force=force,
            plan=plan,
            smoke=not no_smoke,
        )  # fmt: skip (health_timeout/readiness_delay reach the services through the inventory overrides)
        options = RolloutOptions(canary=canary, batch=batch, max_fail=max_fail, lock_wait=lock_wait, forks=forks)
        report = runner.deploy(selection, wheel, settings, options, say=lambda m: console.print(m, markup=False))
        print_report(report, as_json, plan)
        raise typer.Exit(int(report.exit_code(plan)))

    @app.command("rollback")
    @handle_errors
    def rollback(
        inventory: InventoryOpt,
        service_arg: Annotated[str | None, typer.Argument(metavar="[SERVICE]", help="Service to roll back.")] = None,
        host: HostOpt = None,
        service: ServiceOpt = None,
        to: Annotated[str | None, typer.Option("--to", help="Release id to go back to.")] = None,
        lock_wait: Annotated[float, typer.Option("--lock-wait", min=0, help="Seconds to wait for a held lock.")] = 0,
        plan: Annotated[bool, typer.Option("--plan", help="Show the target release; change nothing.")] = False,
        health_timeout: Annotated[float | None, typer.Option("--health-timeout")] = None,
        readiness_delay: Annotated[float | None, typer.Option("--readiness-delay")] = None,
        allow_old_secrets: Annotated[
            bool,
            typer.Option(
                "--allow-old-secrets", help="Roll back even to a release deployed with another (older) API key."
            ),
        ] = False,
        forks: ForksOpt = 16,
        as_json: JsonOpt = False,
    ) -> None:
        """Back to the previous good release (bad ones skipped), health gated."""
        from opsctl.deploy import runner

        services = [*(service or []), *([service_arg] if service_arg else [])] or None
        selection = _selection(inventory, host, services, None, health_timeout, readiness_delay)
        settings = DeploySettings(plan=plan, allow_old_secrets=allow_old_secrets)
        options = RolloutOptions(lock_wait=lock_wait, forks=forks)
        report = runner.rollback(selection, settings, options, say=lambda m: console.print(m, markup=False), to=to)
        print_report(report, as_json, plan)
        raise typer.Exit(int(report.exit_code(plan)))


def _break_locks(selection: list[tuple[Host, list[Service]]], connect: Connect | None = None) -> None:
    from opsctl.remote import connect as ssh_connect

    for h, _ in selection:
        conn = (connect or ssh_connect)(h)
        try:
            holder = conn.run(lock.read_cmd()).stdout.strip()
            conn.run(lock.break_cmd())
        finally:
            conn.close()
        console.print(f"{h.name}: lock cleared" + (f" (was: {' '.join(holder.split())})" if holder else " (none held)"))
