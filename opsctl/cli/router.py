"""`opsctl router remove`: stop and remove a router the inventory no longer names (opsctl.router.remove says
why removal is a command and not the inventory's silence)."""

from __future__ import annotations

from typing import Annotated

import typer

from opsctl.cli.common import InventoryOpt, JsonOpt, console, emit_json, handle_errors, load_inventory
from opsctl.errors import ExitCode, SelectorError
from opsctl.inventory import schema


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="router", help="Routers beyond deploy/rollback/status/logs.", no_args_is_help=True)

    @group.command("remove")
    @handle_errors
    def _remove(
        inventory: InventoryOpt,
        name: Annotated[str, typer.Argument(metavar="NAME", help="The router to remove (as it was named).")],
        host: Annotated[str, typer.Option("--host", help="The inventory host it runs on.", show_default=False)],
        plan: Annotated[bool, typer.Option("--plan", help="Show the commands; change nothing.")] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Stop, disable and remove a router that is no longer in the inventory (its unit and releases)."""
        from opsctl.remote import connect
        from opsctl.router.remove import remove

        router = schema.name(name, "NAME")
        inv = load_inventory(inventory)
        where = schema.name(host, "--host")
        if where not in {h.name for h in inv.hosts}:
            raise SelectorError(f"--host {where}: no such host in the inventory", "name a host of the inventory")
        target = inv.host(where)
        conn = connect(target)
        try:
            result = remove(conn, inv, target, router, plan, lambda m: console.print(m, markup=False))
        finally:
            conn.close()
        if as_json:
            emit_json(result)
        console.print(f"{result.host}/router {result.router}: {result.message}", markup=False)
        for line in result.plan:
            console.print(f"    {line}", markup=False)
        raise typer.Exit(int(ExitCode.CHANGES_PENDING if plan and result.plan else ExitCode.OK))

    app.add_typer(group)
