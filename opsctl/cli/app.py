"""The `opsctl` command: registers every command group. Each group lives in its own module."""

from __future__ import annotations

import importlib

import typer

from opsctl import __version__, bundle

# Every command group, in help order. Each module defines `register(app: typer.Typer) -> None`.
COMMAND_GROUPS = ("provision", "deploy", "smoke", "logs", "status", "bench", "lab", "render", "router", "monitor")

app = typer.Typer(
    name="opsctl",
    help="Take bare GPU hosts over SSH to running, verified SGLang speculative-decoding services.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"opsctl {__version__}\n{bundle.runtime_line()}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    """opsctl: provision, deploy, smoke-test, observe and roll back speculative-decoding services."""


for _group in COMMAND_GROUPS:
    importlib.import_module(f"opsctl.cli.{_group}").register(app)


def main() -> None:
    app()
