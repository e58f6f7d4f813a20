"""`opsctl status`: per service the unit state, NRestarts, current release (mode, time, runtime version),
health and the last DDTREE metrics."""

from __future__ import annotations

from typing import Annotated

import typer

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
from opsctl.errors import ExitCode
from opsctl.inventory.select import select
from opsctl.status import ServiceStatus, collect_all


def register(app: typer.Typer) -> None:
    @app.command("status")
    @handle_errors
    def status(
        inventory: InventoryOpt,
        host: HostOpt = None,
        service: ServiceOpt = None,
        forks: ForksOpt = 16,
        deep: Annotated[
            bool, typer.Option("--deep", help="Also sha256 every model file against provision's manifest (slow).")
        ] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Unit state, restarts, current release, health, model integrity, locks and last DDTREE metrics."""
        from opsctl.remote import connect

        inv = load_inventory(inventory)
        selection = [(h, svcs) for h, svcs in select(inv, split_selector(host), split_selector(service)) if svcs]

        outcomes = collect_all(selection, connect, forks, deep=deep)
        rows: list[ServiceStatus] = []
        errors = []
        for outcome in outcomes:
            if outcome.error is not None:
                errors.append((outcome.host, outcome.error.one_line()))
            else:
                rows += outcome.value or []
        if as_json:
            locks = {r.host: r.lock for r in rows if r.lock}
            emit_json({"services": rows, "locks": locks, "errors": [{"host": h, "error": e} for h, e in errors]})
        else:
            _table(rows)
            for h, held in sorted({r.host: r.lock for r in rows if r.lock}.items()):
                console.print(f"[yellow]{h}: deploy lock held by {held}[/]", markup=True)
            for h, e in errors:
                console.print(f"[bold red]{h}: {e}[/]", markup=True)
        # a missing or changed model: the next restart fails, or the process runs on files that are gone
        unhealthy = errors or any(not r.healthy or not r.models_ok for r in rows)
        raise typer.Exit(int(ExitCode.ERROR if unhealthy else ExitCode.OK))


def _table(rows: list[ServiceStatus]) -> None:
    """One line per service (readable in a terminal, a CI log and a narrow pipe alike)."""
    for r in rows:
        unit = f"{r.unit.active_state}/{r.unit.sub_state}" if r.unit else "?"
        m = r.last_metrics
        colour = "green" if r.healthy else "bold red"
        metrics = f"tau={m.tau:.2f} nodes={m.nodes:.1f} tok/s={m.tok_s:.1f}" if m else "no DDTREE metrics yet"
        console.print(
            f"[{colour}]{r.host}/{r.service}[/] {unit} restarts={r.unit.n_restarts if r.unit else '?'} "
            f"mode={r.mode or '-'} release={r.current or '(none)'} runtime={r.runtime_version or '-'} "
            f"releases={r.releases} bad={r.bad_releases} rollback_to={r.rollback_to or '-'} health={r.health}; "
            f"{metrics}",
            markup=True,
        )
        for line in r.models:
            console.print(f"[bold red]{r.host}/{r.service}: {line}[/]", markup=True)
        if r.incomplete_releases:
            console.print(
                f"[yellow]{r.host}/{r.service}: incomplete release {', '.join(r.incomplete_releases)} "
                "(staging never finished; the next deploy marks it BAD, pruning removes it)[/]",
                markup=True,
            )
