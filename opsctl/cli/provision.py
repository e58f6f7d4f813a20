"""`opsctl provision`: driver, CUDA, venv, runtime wheel and models on every selected host (docs/provision.md).

Exit codes: 0 nothing to do / done, 2 changes pending (--plan), 1 a host failed, 3 a reboot is required.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from opsctl.cli.common import (
    ForksOpt,
    HostOpt,
    InventoryOpt,
    JsonOpt,
    console,
    emit_json,
    handle_errors,
    load_inventory,
    split_selector,
)

_STYLE = {
    "unchanged": "green",
    "changed": "cyan",
    "pending": "yellow",
    "reboot_required": "magenta",
    "failed": "bold red",
    "skipped": "dim",
}


def register(app: typer.Typer) -> None:
    @app.command("provision")
    @handle_errors
    def _provision(
        inventory: InventoryOpt,
        host: HostOpt = None,
        plan: Annotated[
            bool, typer.Option("--plan", help="Read facts and print the commands; change nothing.")
        ] = False,
        wheelhouse: Annotated[
            Path | None,
            typer.Option("--wheelhouse", help="Local wheel directory to push and install from (--no-index)."),
        ] = None,
        runtime_wheel: Annotated[
            Path | None,
            typer.Option("--runtime-wheel", help="Push this ddtree-runtime wheel instead of building runtime/."),
        ] = None,
        reboot: Annotated[
            bool, typer.Option("--reboot", help="Reboot after a driver install, wait, check again.")
        ] = False,
        require_gpu: Annotated[
            bool, typer.Option("--require-gpu", help="A host without an NVIDIA GPU is an error.")
        ] = False,
        accept_model: Annotated[
            list[str] | None,
            typer.Option(
                "--accept-model",
                metavar="PATH",
                help="Accept this model's source (its destination path) as the new model, though it differs "
                "from the one accepted on the host (repeatable).",
            ),
        ] = None,
        forks: ForksOpt = 16,
        json_out: JsonOpt = False,
    ) -> None:
        """Bring hosts to the inventory's state: driver, CUDA, venv, runtime wheel, models. Idempotent."""
        from opsctl.inventory.select import select
        from opsctl.ops.base import Options
        from opsctl.provision import Settings, accepted_models, provision

        inv = load_inventory(inventory)
        hosts = [h for h, _ in select(inv, split_selector(host), None)]
        accept = accepted_models(hosts, accept_model or [])
        settings = Settings(
            plan_only=plan,
            options=Options(reboot=reboot, require_gpu=require_gpu, accept_models=accept),
            wheelhouse=wheelhouse,
            runtime_wheel=runtime_wheel,
            forks=forks,
        )
        result = provision(hosts, settings, routers=inv.routers)
        if json_out:
            emit_json(_as_json(result))
        _print_human(result)
        raise typer.Exit(int(result.exit_code))


def _as_json(result: Any) -> dict[str, Any]:
    return {
        "plan": result.plan,
        "exit_code": int(result.exit_code),
        "hosts": [
            {
                "host": h.host,
                "status": h.status.value,
                "changes": h.changes,
                "error": h.error,
                "hint": h.hint,
                "steps": [
                    {
                        "op": s.op,
                        "status": s.status.value,
                        "commands": list(s.commands),
                        "notes": list(s.notes),
                        "error": s.error,
                        "hint": s.hint,
                    }
                    for s in h.steps
                ],
            }
            for h in result.hosts
        ],
    }


def _print_human(result: Any) -> None:
    from rich.table import Table

    for h in result.hosts:
        if h.error:
            console.print(f"[bold]{h.host}[/]  [bold red]failed[/]  {h.error}" + (f" ({h.hint})" if h.hint else ""))
        for s in h.steps:
            style = _STYLE.get(s.status.value, "")
            line = f"[bold]{h.host}[/]  {s.op:<13} [{style}]{s.status.value}[/]"
            if s.notes:
                line += "  " + "; ".join(s.notes)
            console.print(line, markup=True, highlight=False)
            if s.commands and (result.plan or s.status.value == "failed"):
                for cmd in s.commands:
                    console.print(f"    $ {cmd}", markup=False, highlight=False)
            if s.error:
                console.print(
                    f"    [bold red]error:[/] {s.error}" + (f" ({s.hint})" if s.hint else ""), highlight=False
                )
    table = Table(title="provision plan" if result.plan else "provision", title_justify="left")
    for column in ("host", "status", "changed", "unchanged", "failed", "reboot needed"):
        table.add_column(column)
    for h in result.hosts:
        by = [s.status.value for s in h.steps]
        changed = [s.op for s in h.steps if s.status.value in ("changed", "pending")]
        failed = [s.op for s in h.steps if s.status.value == "failed"] or (["connect"] if h.error else [])
        table.add_row(
            h.host,
            f"[{_STYLE.get(h.status.value, '')}]{h.status.value}[/]",
            ", ".join(changed) or "-",
            str(by.count("unchanged")),
            ", ".join(failed) or "-",
            "yes" if h.status.value == "reboot_required" else "no",
        )
    console.print(table)
