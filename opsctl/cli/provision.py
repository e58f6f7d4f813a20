"""`opsctl provision` (placeholder until its issue lands: says so and exits non-zero)."""

from __future__ import annotations

import typer

from opsctl.cli.common import handle_errors
from opsctl.errors import NotImplementedYet


def register(app: typer.Typer) -> None:
    @app.command("provision", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    @handle_errors
    def _provision() -> None:
        """Not implemented yet."""
        raise NotImplementedYet("provision")
