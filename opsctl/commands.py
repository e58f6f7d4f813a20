"""Commands are values: argv lists built by pure functions, quoted and masked by type.

A `Cmd` renders to a shell string only at the remote boundary. Secret arguments are `Masked`: they show as
*** in every printed form. Remote layers must not put a Masked value on a command line at all (pass it on
stdin or in a 0600 file); `Cmd.has_secrets` lets them refuse.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from opsctl.secrets import MASK


@dataclass(frozen=True)
class Masked:
    """An argument whose value must never be shown."""

    value: str = field(repr=False)

    def __str__(self) -> str:
        return MASK


@dataclass(frozen=True)
class Raw:
    """A shell fragment passed through unquoted (operators such as `&&`, `|`, `>`). Use sparingly."""

    text: str


Arg = str | Masked | Raw


@dataclass(frozen=True)
class Cmd:
    """One command: argv plus optional stdin (never shown) and whether it needs root (sudo)."""

    argv: tuple[Arg, ...]
    stdin: str | None = field(default=None, repr=False)
    sudo: bool = False

    @staticmethod
    def of(*argv: Arg, stdin: str | None = None, sudo: bool = False) -> Cmd:
        return Cmd(tuple(argv), stdin=stdin, sudo=sudo)

    @property
    def has_secrets(self) -> bool:
        return any(isinstance(a, Masked) for a in self.argv)

    def shell(self) -> str:
        """The string to execute. Masked values are included: callers must refuse when has_secrets."""
        return " ".join(_quote(a, reveal=True) for a in self.argv)

    def display(self) -> str:
        """The string to print: secrets as ***."""
        return " ".join(_quote(a, reveal=False) for a in self.argv)

    def __str__(self) -> str:
        return self.display()


def _quote(arg: Arg, reveal: bool) -> str:
    if isinstance(arg, Raw):
        return arg.text
    if isinstance(arg, Masked):
        return shlex.quote(arg.value) if reveal else MASK
    return shlex.quote(arg)


def sh(script: str, sudo: bool = False) -> Cmd:
    """A small shell script run with `sh -c` (for pipelines and redirects); quoted as one argument."""
    return Cmd.of("sh", "-c", script, sudo=sudo)
