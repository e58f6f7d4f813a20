"""Options shared by every command, machine output, and the one place expected errors become exit codes."""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from opsctl.errors import ExitCode, OpsctlError
from opsctl.secrets import MASK, SecretRef

if TYPE_CHECKING:
    from opsctl.inventory.load import Override

# The library's hints name the inventory `-i INVENTORY` (it does not know the file); every line the CLI prints
# names the file this command loaded instead, as the user typed it (shell-quoted): `opsctl provision -i
# inventory/lab.yaml --host lab2`.
INVENTORY_PLACEHOLDER = "-i INVENTORY"


class _Console(Console):
    """stderr, with the placeholder above replaced by the inventory this command loaded."""

    inventory: str | None = None

    def name_inventory(self, text: str, markup: bool = False) -> str:
        if not self.inventory or INVENTORY_PLACEHOLDER not in text:
            return text
        named = f"-i {shlex.quote(self.inventory)}"
        return text.replace(INVENTORY_PLACEHOLDER, escape(named) if markup else named)

    def print(self, *objects: Any, **kwargs: Any) -> None:
        markup = kwargs.get("markup", True) is not False
        super().print(*(self.name_inventory(o, markup) if isinstance(o, str) else o for o in objects), **kwargs)


console = _Console(stderr=True, highlight=False, soft_wrap=True)

InventoryOpt = Annotated[Path, typer.Option("-i", "--inventory", help="Inventory YAML file.", show_default=False)]
HostOpt = Annotated[
    list[str] | None,
    typer.Option("--host", help="Only these hosts (repeatable, or comma separated). No match is an error."),
]
ServiceOpt = Annotated[
    list[str] | None,
    typer.Option("--service", help="Only these services (repeatable, or comma separated). No match is an error."),
]
RouterOpt = Annotated[
    list[str] | None,
    typer.Option("--router", help="These routers (repeatable, or comma separated). No match is an error."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
ForksOpt = Annotated[int, typer.Option("--forks", min=1, max=256, help="Hosts worked on in parallel.")]

P = ParamSpec("P")
R = TypeVar("R")


def split_selector(values: list[str] | None) -> list[str] | None:
    """`--host a,b --host c` -> ["a", "b", "c"]; None when not given."""
    if not values:
        return None
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums, paths and tuples to JSON types. Secrets become ***."""
    if isinstance(value, SecretRef):
        return MASK
    if is_dataclass(value) and not isinstance(value, type):
        return {k: to_jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    if isinstance(value, str):
        return console.name_inventory(value)
    return value


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(data), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def plain(text: str) -> str:
    """`text` safe for a terminal: control characters (escape sequences, newlines) shown as \\xNN."""
    return "".join(
        ch if ch.isprintable() else f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}" for ch in text
    )


def say(label: str, style: str, text: str) -> None:
    """One line on stderr: a styled label, then `text` as plain text (never read as rich markup or emoji)."""
    console.print(Text.assemble((label, style), " ", plain(console.name_inventory(text))))


def fail(error: OpsctlError) -> typer.Exit:
    say("error:", "bold red", error.one_line())
    return typer.Exit(int(error.exit_code))


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Expected errors -> one line + exit code; Ctrl-C -> 130; bugs -> one line (traceback with OPSCTL_DEBUG=1)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        console.inventory = None  # until this command loads one
        try:
            return _run(fn, *args, **kwargs)
        finally:
            console.inventory = None  # a process that runs several commands (tests) starts each one clean

    return wrapper


def _run(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`fn`, its expected errors turned into one line and an exit code (`handle_errors`)."""
    try:
        return fn(*args, **kwargs)
    except OpsctlError as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:
        console.print("interrupted")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:
        if os.environ.get("OPSCTL_DEBUG"):
            raise
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        say(
            "internal error:",
            "bold red",
            f"{type(exc).__name__}: {first} (a bug in opsctl; rerun with OPSCTL_DEBUG=1 for the traceback "
            "and report it)",
        )
        raise typer.Exit(int(ExitCode.ERROR)) from None


def load_inventory(path: Path, overrides: Sequence[Override] = ()) -> Any:
    """Load and validate the inventory, with any command-line overrides applied before validation (one code
    path: an override gets the same rules and warnings as the file); print its loud warnings on stderr."""
    from opsctl.inventory.load import load_inventory as _load

    inventory = _load(path, overrides)
    console.inventory = str(path)
    for warning in inventory.warnings:
        say("WARNING:", "bold yellow", warning)
    return inventory
