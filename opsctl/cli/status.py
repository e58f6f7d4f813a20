"""`opsctl status`: per service the unit state, NRestarts, current release (mode, time, runtime version),
health and the DDTREE metrics (from the service's /metrics where it has the `ddtree_*` series, else the journal)."""

from __future__ import annotations

from typing import Annotated

import httpx
import typer

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
from opsctl.errors import ExitCode, UnreachableError, host_line
from opsctl.inventory.model import Inventory, Router
from opsctl.inventory.select import select, select_routers
from opsctl.router.remove import collect_orphans
from opsctl.router.status import RouterStatus, collect_router
from opsctl.status import MetricsSource, ServiceStatus, collect_all


def register(app: typer.Typer) -> None:
    @app.command("status")
    @handle_errors
    def status(
        inventory: InventoryOpt,
        host: HostOpt = None,
        service: ServiceOpt = None,
        router: RouterOpt = None,
        forks: ForksOpt = 16,
        deep: Annotated[
            bool, typer.Option("--deep", help="Also sha256 every model file against provision's manifest (slow).")
        ] = False,
        canary: Annotated[
            bool, typer.Option("--canary", help="Also print each router's last canary comparison table.")
        ] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Unit state, restarts, current release, health and last DDTREE metrics of every selected service; each
        router's unit, release, health and members as the router sees them, and its last canary in one line
        (`--canary`: its whole comparison table; `--json` always carries it)."""
        from opsctl.remote.ssh import connect_for_reads as connect

        inv = load_inventory(inventory)
        routers_only = router is not None and host is None and service is None
        selection = [] if routers_only else [
            (h, svcs) for h, svcs in select(inv, split_selector(host), split_selector(service)) if svcs
        ]  # fmt: skip
        picked = select_routers(inv, split_selector(router), split_selector(host)) if service is None else []

        outcomes = collect_all(selection, connect, forks, deep=deep)
        rows: list[ServiceStatus] = []
        errors = []
        for outcome in outcomes:
            if outcome.error is not None:
                errors.append((outcome.host, host_line(outcome.host, outcome.error.one_line())))
            else:
                rows += outcome.value or []
        # A host found unreachable is not asked again (each try costs a connect timeout)
        unreachable = {o.host for o in outcomes if isinstance(o.error, UnreachableError)}
        router_rows = _routers(inv, picked, unreachable)
        # routers the inventory no longer names keep serving: on the hosts looked at (a second connection each)
        looked_at = [h for h, _ in selection if h.name not in unreachable]
        orphans = [] if routers_only else collect_orphans(inv, looked_at, connect, forks)
        if as_json:
            locks = {r.host: r.lock for r in rows if r.lock}
            emit_json(
                {
                    "services": rows,
                    "routers": router_rows,
                    "orphan_routers": orphans,
                    "locks": locks,
                    "errors": [{"host": h, "error": e} for h, e in errors],
                }
            )
        else:
            _table(rows)
            _router_table(router_rows, canary_table=canary)
            for h, held in sorted({r.host: r.lock for r in rows if r.lock}.items()):
                console.print(f"[yellow]{h}: deploy lock held by {held}[/]", markup=True)
            for h in sorted({r.host for r in rows if r.lock_stale}):
                console.print(
                    f"[bold red]{h}: the stale lock refuses every deploy: clear it with "
                    f"`opsctl deploy --break-lock --host {h} -i INVENTORY`[/]",
                    markup=True,
                )
            for o in orphans:
                console.print(
                    f"[bold red]{o.host}/router {o.router}: not in the inventory but installed ({o.unit}); "
                    f"{o.hint()}[/]",
                    markup=True,
                )
            for _, e in errors:
                console.print(f"[bold red]{e}[/]", markup=True)
        # a missing or changed model: the next restart fails, or the process runs on files that are gone;
        # a stale lock: every deploy is refused until it is cleared
        unhealthy = errors or orphans or any(r.failing for r in rows) or any(r.failing for r in router_rows)
        raise typer.Exit(int(ExitCode.ERROR if unhealthy else ExitCode.OK))


def _table(rows: list[ServiceStatus]) -> None:
    """One line per service (readable in a terminal, a CI log and a narrow pipe alike)."""
    for r in rows:
        unit = f"{r.unit.active_state}/{r.unit.sub_state}" if r.unit else "?"
        m = r.last_metrics
        colour = "green" if r.healthy else "bold red"
        metrics = f"tau={m.tau:.2f} nodes={m.nodes:.1f} tok/s={m.tok_s:.1f}" if m else "no DDTREE metrics yet"
        if m is not None and m.policy is not None:
            metrics += f" policy {m.policy.describe()}"
        if m is not None:  # /metrics: means since the process started; the journal: over the last line's window
            metrics += " (since start, /metrics)" if r.metrics_source is MetricsSource.PROMETHEUS else " (last line)"
        console.print(
            f"[{colour}]{r.host}/{r.service}[/] {unit} restarts={r.unit.n_restarts if r.unit else '?'} "
            f"mode={r.mode or '-'} release={r.current or '(none)'} runtime={r.runtime_version or '-'} "
            f"releases={r.releases} bad={r.bad_releases} rollback_to={r.rollback_to or '-'} health={r.health}; "
            f"{metrics}",
            markup=True,
        )
        for line in r.models:
            console.print(f"[bold red]{r.host}/{r.service}: {line}[/]", markup=True)
        deploy = f"`opsctl deploy -i INVENTORY --host {r.host} --service {r.service}`"
        _gates_and_drift(f"{r.host}/{r.service}", "the service", deploy, r)
        if r.incomplete_releases:
            console.print(
                f"[yellow]{r.host}/{r.service}: incomplete release {', '.join(r.incomplete_releases)} "
                "(staging never finished; the next deploy marks it BAD, pruning removes it)[/]",
                markup=True,
            )


def _gates_and_drift(name: str, noun: str, deploy: str, r: ServiceStatus | RouterStatus, indent: str = "") -> None:
    """A deploy in progress, a release whose gates never finished, and drift with the deploy that repairs it: the
    same lines for a service and a router (`deploy`: the command that deploys it; a router's lines are indented)."""
    if r.deploying and (r.gates_pending or not r.healthy):
        doing = f"release {r.current} is going through its gates" if r.gates_pending else f"it restarts {noun}"
        console.print(
            f"{indent}[yellow]{name}: a deploy is in progress ({doing}; deploy lock held by {r.lock}); "
            "not counted as a failure until it ends[/]",
            markup=True,
        )
    elif r.gates_pending:
        console.print(
            f"{indent}[bold red]{name}: release {r.current} went live but never finished its gates (interrupted): "
            f"{deploy} runs them, or rolls back[/]",
            markup=True,
        )
    for line in r.drift:
        console.print(f"{indent}[bold red]{name}: {line}[/]", markup=True)
    if r.drift:
        current = any(not line.startswith("rollback target ") for line in r.drift)
        target = any(line.startswith("rollback target ") for line in r.drift)
        does = (["writes the current release's files again"] if current else []) + (
            [f"marks the drifted rollback target {r.rollback_to} BAD (rollback then goes to the release before it)"]
            if target
            else []
        )
        console.print(f"{indent}[bold red]{name}: {deploy} {' and '.join(does)}[/]", markup=True)


def _routers(inv: Inventory, routers: list[Router], unreachable: set[str]) -> list[RouterStatus]:
    from opsctl.errors import OpsctlError
    from opsctl.remote.ssh import connect_for_reads as connect

    out = []
    with httpx.Client() as http:
        for router in routers:
            try:
                conn = None if router.host in unreachable else connect(inv.host(router.host))
            except OpsctlError:
                conn = None
            try:
                out.append(collect_router(conn, inv, router, http))
            finally:
                if conn is not None:
                    conn.close()
    return out


def _router_table(rows: list[RouterStatus], canary_table: bool = False) -> None:
    for r in rows:
        unit = f"{r.unit.active_state}/{r.unit.sub_state}" if r.unit else "?"
        if r.unit is not None:  # a restart re-admits every worker of its --worker-urls: worth seeing
            unit += f" restarts={r.unit.n_restarts} since {r.unit.active_enter or '?'}"
        colour = "green" if r.healthy else "bold red"
        console.print(
            f"[{colour}]{r.host}/router {r.router}[/] {r.url} {unit} release={r.current or '(none)'} "
            f"releases={r.releases} bad={r.bad_releases} rollback_to={r.rollback_to or '-'} health={r.health}",
            markup=True,
        )
        for m in r.members:
            state = "[green]healthy[/]" if m.healthy else "[bold red]unhealthy[/]"
            console.print(f"    member {m.worker} {m.url} {state} in_flight={m.load}", markup=True)
        for name in r.missing:
            console.print(f"    [bold red]member {name}: not in the router[/]", markup=True)
        if r.kept_out:  # a deploy's gates are running, or a worker was left out as not serving
            console.print(
                f"    kept out by opsctl (a restart of the router starts without them): {', '.join(r.kept_out)}",
                markup=False,
            )
        for line in r.deploys:
            console.print(f"    out for a deploy: {line}", markup=False)
        if r.error:
            console.print(f"    [bold red]{r.error}[/]", markup=True)
        deploy = f"`opsctl deploy -i INVENTORY --router {r.router}`"
        _gates_and_drift(f"{r.host}/router {r.router}", "the router", deploy, r, indent="    ")
        if r.unit is not None and r.unit.active_state not in ("active", "activating", "reloading"):
            console.print(
                f"    [bold red]`opsctl deploy -i INVENTORY --router {r.router}` starts its current release again "
                f"(health gated); `opsctl logs -i INVENTORY --router {r.router}` shows why it stopped[/]",
                markup=True,
            )
        if r.canary:
            c = r.canary
            table = c.get("table") or []
            # one line unless asked: every status would repeat the whole comparison of a canary long finished
            more = f" (comparison: {len(table)} lines, `opsctl status --canary`)" if table and not canary_table else ""
            console.print(
                f"    canary {c.get('phase', '?')} (updated {c.get('updated', '?')}): canary "
                f"{', '.join(c.get('canary') or [])} vs old {', '.join(c.get('old') or [])}; {c.get('message', '')}"
                + more,
                markup=False,
            )
            for line in table if canary_table else []:
                console.print(f"      {line}", markup=False)
