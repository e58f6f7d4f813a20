"""Hints name the inventory the command loaded (they said `-i INVENTORY` whatever file was used):
the library writes the placeholder, the CLI's console and JSON output put the file in, shell-quoted and never
read as rich markup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from opsctl.cli import common
from opsctl.cli.common import console, emit_json, say
from opsctl.errors import OpsctlError


@pytest.fixture
def named() -> object:
    console.inventory = "inv ventory/[lab].yaml"
    yield console
    console.inventory = None


def test_console_lines_say_and_json_name_the_inventory(named: object, capsys: pytest.CaptureFixture[str]) -> None:
    hint = "`opsctl provision -i INVENTORY --host lab2` copies it back"
    with console.capture() as captured:
        console.print(f"[bold red]lab2/ref: {hint}[/]", markup=True)
        console.print(hint, markup=False)
        say("error:", "bold red", hint)
    lines = captured.get().splitlines()
    quoted = "-i 'inv ventory/[lab].yaml'"
    assert lines == [
        f"lab2/ref: `opsctl provision {quoted} --host lab2` copies it back",
        f"`opsctl provision {quoted} --host lab2` copies it back",
        f"error: `opsctl provision {quoted} --host lab2` copies it back",
    ]
    emit_json({"errors": [{"host": "lab2", "error": hint}]})
    assert json.loads(capsys.readouterr().out)["errors"][0]["error"].startswith(f"`opsctl provision {quoted} ")


def test_without_an_inventory_the_placeholder_stays(tmp_path: Path) -> None:
    assert console.inventory is None
    assert console.name_inventory("opsctl logs -i INVENTORY --host h") == "opsctl logs -i INVENTORY --host h"


def test_loading_an_inventory_names_it(tmp_path: Path) -> None:
    file = tmp_path / "fleet.yaml"
    file.write_text("hosts:\n  h:\n    address: 10.0.0.1\n")
    try:
        common.load_inventory(file)
        assert console.name_inventory("opsctl status -i INVENTORY") == f"opsctl status -i {file}"
    finally:
        console.inventory = None


def test_a_command_leaves_no_inventory_name_behind(tmp_path: Path) -> None:
    # a process that runs several commands (the unit tests do) must not name one command's file in the next one's
    file = tmp_path / "fleet.yaml"
    file.write_text("hosts:\n  h:\n    address: 10.0.0.1\n")
    seen: list[str | None] = []

    @common.handle_errors
    def command(fail: bool) -> None:
        common.load_inventory(file)
        seen.append(console.inventory)
        if fail:
            raise OpsctlError("lab2: broken", "`opsctl status -i INVENTORY` says why")

    command(False)
    assert seen == [str(file)] and console.inventory is None
    with console.capture() as captured, pytest.raises(typer.Exit):
        command(True)
    assert f"-i {file}" in captured.get()  # the failing command's own line still names its file
    assert console.inventory is None
