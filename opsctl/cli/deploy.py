"""`opsctl deploy` and `opsctl rollback` (placeholders until their issue lands)."""

from __future__ import annotations

import typer

from opsctl.cli.common import handle_errors
from opsctl.errors import NotImplementedYet


def register(app: typer.Typer) -> None:
    @app.command("deploy", help="Not implemented yet.")
    @handle_errors
    def _deploy() -> None:
        raise NotImplementedYet("deploy")

    @app.command("rollback", help="Not implemented yet.")
    @handle_errors
    def _rollback() -> None:
        raise NotImplementedYet("rollback")
