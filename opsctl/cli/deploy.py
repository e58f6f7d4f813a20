"""`opsctl deploy` and `opsctl rollback`: thin; the work is in opsctl.deploy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from opsctl import layout
from opsctl.cli.common import (
    ForksOpt,
    HostOpt,
    InventoryOpt,
    JsonOpt,
    RouterOpt,
    ServiceOpt,
    console,
    emit_json,
    handle_errors,
    load_inventory,
    split_selector,
)
from opsctl.deploy import lock
from opsctl.deploy.flow import DeploySettings, ServiceResult
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.release import DEFAULT_KEEP
from opsctl.errors import DeployError, ExitCode, without_prefixes
from opsctl.inventory.load import Override
from opsctl.inventory.model import Host, Inventory, Mode, Service
from opsctl.inventory.select import select, select_routers
from opsctl.progress import Ticker
from opsctl.remote.base import Connect
from opsctl.rollout.canary import Canary, CanaryReport
from opsctl.rollout.canary import fronted_selection as canary_router
from opsctl.rollout.canary import plan_lines as canary_plan
from opsctl.rollout.runner import RolloutOptions, RunReport
from opsctl.router.deploy import RouterResult

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


def _selection(inv: Inventory, host: list[str] | None, service: list[str] | None) -> list[tuple[Host, list[Service]]]:
    """The selected services of an inventory loaded once per command (its warnings printed once)."""
    picked = select(inv, split_selector(host), split_selector(service))
    selection = [(h, svcs) for h, svcs in picked if svcs]
    if not selection:
        raise DeployError("no services selected", "the inventory's hosts have no services")
    return selection


def print_report(
    report: RunReport,
    as_json: bool,
    plan: bool = False,
    routers: Sequence[RouterResult] = (),
    canary: CanaryReport | None = None,
) -> None:
    if as_json:
        emit_json(
            {
                "action": report.action,
                "interrupted": report.interrupted,
                "stopped_early": report.stopped_early,
                "failures": report.failures + sum(1 for r in routers if r.outcome.failed),
                "results": report.results,
                "routers": list(routers),
                **({"canary": canary} if canary is not None else {}),
            }
        )
    for r in report.results:
        _print_result(r, plan)
    for rr in routers:
        _print_result(rr, plan)
    if canary is not None:
        if plan:
            for line in canary.message.split(" | "):
                console.print(f"    {line}", markup=False)
        else:
            for line in canary.table:
                console.print(f"    {line}", markup=False)
            said = without_prefixes(canary.message, canary.phase)  # not "interrupted: interrupted: ..."
            console.print(f"canary behind router {canary.router}: {canary.phase}: {said}", markup=False)
    if report.stopped_early:
        console.print("[bold red]rollout stopped:[/] failures exceeded --max-fail", markup=True)
    if report.interrupted:
        console.print("interrupted: locks released; previous releases serving")


def _exit(report: RunReport, routers: Sequence[RouterResult], plan: bool) -> int:
    code = int(report.exit_code(plan))
    if code in (0, int(ExitCode.CHANGES_PENDING)) and any(r.outcome.failed for r in routers):
        return int(ExitCode.ERROR)
    if code == 0 and plan and any(r.outcome is Outcome.PLANNED for r in routers):
        return int(ExitCode.CHANGES_PENDING)
    return code


def _message(r: ServiceResult | RouterResult, name: str) -> str:
    """The result's message without what its printed prefix already says (`lab2/ref: unreachable` before
    `lab2: unreachable: ...`, `interrupted` before `interrupted: ...`)."""
    return without_prefixes(r.message, r.host, f"{r.host}/{name}", r.outcome.value)


def _print_result(r: ServiceResult | RouterResult, plan: bool) -> None:
    style = _STYLE.get(r.outcome, "bold red")
    name = r.service if isinstance(r, ServiceResult) else f"router {r.router}"
    unit = layout.unit_name(r.service if isinstance(r, ServiceResult) else f"router-{r.router}")
    console.print(f"[{style}]{r.host}/{name}: {r.outcome.value}[/] {escape(_message(r, name))}", markup=True)
    for line in r.plan:
        console.print(f"    {line}", markup=False)
    if r.journal_tail:
        console.print(f"    --- journal tail of {unit} on {r.host} ---", markup=False)
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
        canary: Annotated[
            bool,
            typer.Option(
                "--canary",
                help="Deploy the first service alone first; behind a router with a `canary:` block, judge it "
                "against the rest on live traffic, then promote or roll back.",
            ),
        ] = False,
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
        router: RouterOpt = None,
        forks: ForksOpt = 16,
        as_json: JsonOpt = False,
    ) -> None:
        """Deploy a release per service: stage, verify, switch, restart, health + smoke gates, auto-rollback.
        A service behind a router is taken out of it first, drained, and put back once it passes its gates;
        then the routers themselves (`--router NAME` alone: only those routers)."""
        from opsctl.artifact import runtime_wheel as build_wheel
        from opsctl.rollout import runner
        from opsctl.rollout.rolling import RouterGuard
        from opsctl.router.keptout import KeptOutRecorder
        from opsctl.router.run import run_routers

        def say(message: str) -> None:
            console.print(message, markup=False)

        routers_only = router is not None and host is None and service is None
        given = overrides(split_selector(host), split_selector(service), mode, health_timeout, readiness_delay)
        inv = load_inventory(inventory, given)
        routers = select_routers(inv, split_selector(router), split_selector(host))
        report = RunReport("deploy")
        canary_report: CanaryReport | None = None
        if not routers_only:
            selection = _selection(inv, host, service)
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
            guard = RouterGuard(inv, kept_out=KeptOutRecorder(inv)) if inv.routers else None
            behind = canary_router(inv, selection) if canary else None
            try:
                if behind is not None and not plan:
                    job = Canary(inv, behind, selection, say, guard=guard)
                    try:
                        report, canary_report = job.run(wheel, settings, options)
                    finally:
                        job.close()
                else:
                    report = runner.deploy(selection, wheel, settings, options, say=say, routers=guard)
                    if behind is not None:
                        canary_report = CanaryReport(behind.name, "planned", message=" | ".join(
                            canary_plan(behind, selection)))  # fmt: skip
            finally:
                if guard is not None:
                    guard.close()
        # --force restarts a router only when named (--router): a forced service deploy must not cut its clients.
        router_results = [] if report.interrupted else run_routers(
            inv, routers, "deploy", say, force=force and router is not None, plan=plan, keep=keep, lock_wait=lock_wait
        )  # fmt: skip
        print_report(report, as_json, plan, router_results, canary_report)
        raise typer.Exit(int(_exit(report, router_results, plan)))

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
        router: RouterOpt = None,
        allow_old_secrets: Annotated[
            bool,
            typer.Option(
                "--allow-old-secrets", help="Roll back even to a release deployed with another (older) API key."
            ),
        ] = False,
        force: Annotated[
            bool,
            typer.Option(
                "--force",
                help="With --to: go back even to a release marked BAD (its health and smoke gates run first).",
            ),
        ] = False,
        forks: ForksOpt = 16,
        as_json: JsonOpt = False,
    ) -> None:
        """Back to the previous good release (bad ones skipped), health and smoke gated. `--to` a release that
        never finished its gates warns and runs them; `--to` one marked BAD needs --force. `--router NAME`: that
        router."""
        from opsctl.rollout import runner
        from opsctl.rollout.rolling import RouterGuard
        from opsctl.router.keptout import KeptOutRecorder
        from opsctl.router.run import run_routers

        if router is not None:
            inv = load_inventory(inventory)
            results = run_routers(
                inv, select_routers(inv, split_selector(router)), "rollback",
                lambda m: console.print(m, markup=False), plan=plan, to=to, lock_wait=lock_wait,
            )  # fmt: skip
            print_report(RunReport("rollback"), as_json, plan, results)
            raise typer.Exit(int(_exit(RunReport("rollback"), results, plan)))
        services = [*(service or []), *([service_arg] if service_arg else [])] or None
        given = overrides(split_selector(host), split_selector(services), None, health_timeout, readiness_delay)
        inv = load_inventory(inventory, given)
        selection = _selection(inv, host, services)
        settings = DeploySettings(plan=plan, allow_old_secrets=allow_old_secrets, force=force)
        options = RolloutOptions(lock_wait=lock_wait, forks=forks)
        guard = RouterGuard(inv, kept_out=KeptOutRecorder(inv)) if inv.routers else None
        try:
            report = runner.rollback(
                selection, settings, options, say=lambda m: console.print(m, markup=False), to=to, routers=guard
            )
        finally:
            if guard is not None:
                guard.close()
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
