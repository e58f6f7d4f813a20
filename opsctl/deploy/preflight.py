"""Pre-flight of a staged release, before anything live changes: every flag the release passes to the server
must be one the host's own server knows (`--help` of the installed version, with the release's runtime on
PYTHONPATH). Flag names drift between SGLang releases; a misspelt extra arg would otherwise only show as a
server that exits at start, after the old release was already stopped."""

from __future__ import annotations

import re
import shlex

from opsctl.commands import Cmd, sh

_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)")
HELP_TIMEOUT_S = 300.0


def help_cmd(venv: str, module: str, site: str) -> Cmd:
    """The server's --help as the release would run it (same interpreter, the release's site dir first)."""
    return sh(
        f"PYTHONPATH={shlex.quote(site)} {shlex.quote(venv + '/bin/python')} -m {shlex.quote(module)} --help 2>&1",
        sudo=True,
    )


def parse_help_flags(text: str) -> set[str]:
    """Every --flag named in argparse help output (usage line and option list)."""
    return {m.group(1).rstrip("-") for m in _FLAG.finditer(text)}


def used_flags(argv: tuple[str, ...]) -> list[str]:
    """The --flags in an argv (`--key=value` counts as --key), in order, without duplicates."""
    seen: list[str] = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            flag = arg.split("=", 1)[0]
            if flag not in seen:
                seen.append(flag)
    return seen


def unknown_flags(argv: tuple[str, ...], help_text: str) -> list[str]:
    known = parse_help_flags(help_text)
    return [f for f in used_flags(argv) if f not in known]


def looks_like_help(text: str) -> bool:
    return "usage:" in text.lower() and "--" in text
