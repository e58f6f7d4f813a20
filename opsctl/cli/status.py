"""`opsctl status` (placeholder until its issue lands: says so and exits non-zero)."""

from __future__ import annotations

import typer

from opsctl.cli.common import handle_errors
from opsctl.errors import NotImplementedYet


def register(app: typer.Typer) -> None:
    @app.command("status", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    @handle_errors
    def _status() -> None:
        """Not implemented yet."""
        raise NotImplementedYet("status")
