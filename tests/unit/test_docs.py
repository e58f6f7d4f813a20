"""The docs stay honest: every relative link in docs/*.md and README.md resolves, and every `opsctl ...` command
they quote (inline code, or a line of a fenced code block) names a command, subcommand and options that the CLI's
own help knows."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from opsctl.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^\s*(```|~~~)")
# A quoted command line may start with a prompt, environment assignments or `sudo`.
PREFIX = re.compile(r"^(?:\$\s+)?(?:sudo\s+(?:-E\s+)?)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*")


def _ids(path: Path) -> set[str]:
    """GitHub's anchors for a markdown file's headings."""
    ids = set()
    in_fence = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (m := re.match(r"^#+\s+(.*)$", line)):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            ids.add(slug)
    return ids


def _links(path: Path) -> Iterator[tuple[int, str]]:
    in_fence = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for target in LINK.findall(INLINE.sub("", line)):
            yield n, target


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("//")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for n, target in _links(doc):
        if not _relative(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{doc.name}:{n}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _ids(dest):
            broken.append(f"{doc.name}:{n}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def _quoted_commands(path: Path) -> Iterator[tuple[int, str]]:
    """`opsctl ...` as inline code anywhere, and as a line of a fenced code block."""
    in_fence = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        candidates = [line.split(" #")[0]] if in_fence else INLINE.findall(line)
        for text in candidates:
            text = PREFIX.sub("", text.strip())
            for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", text):
                if part.startswith("opsctl "):
                    yield n, part


def _words(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote in prose: take the words as they are
        return command.split()


def _is_group(node: Any) -> bool:
    return hasattr(node, "commands")  # typer ships its own click: compare by shape, not by class


def check_command(root: Any, command: str) -> str | None:
    """None when `command` names an existing command with options it knows, else what is wrong."""
    words = _words(command)[1:]
    node = root
    path = ["opsctl"]
    while _is_group(node) and words and not words[0].startswith("-"):
        word = words.pop(0)
        if word in ("...", "<command>", "COMMAND"):
            return None
        sub = node.commands.get(word)
        if sub is None:
            return f"`{' '.join(path)}` has no command {word!r}"
        node, path = sub, [*path, word]
    if _is_group(node) and node is not root:
        return None  # a group named alone, e.g. `opsctl lab`
    known = {opt for param in node.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
    for word in words:
        if word.startswith("--") and len(word) > 2:
            name = word.split("=", 1)[0]
            if re.fullmatch(r"--[a-z0-9][a-z0-9-]*", name) and name not in known:
                return f"`{' '.join(path)}` has no option {name}"
    return None


def test_every_quoted_opsctl_command_exists() -> None:
    root = typer.main.get_command(app)
    assert _is_group(root)
    wrong = []
    count = 0
    for doc in DOCS:
        for n, command in _quoted_commands(doc):
            count += 1
            if problem := check_command(root, command):
                wrong.append(f"{doc.name}:{n}: {command}: {problem}")
    assert count > 50, f"found only {count} quoted commands: is the scan broken?"
    assert not wrong, "\n".join(wrong)


def test_the_check_can_fail() -> None:
    root = typer.main.get_command(app)
    assert _is_group(root)
    assert check_command(root, "opsctl deploy --plan") is None
    assert check_command(root, "opsctl lab up --hosts 2") is None
    assert check_command(root, "opsctl router remove") is None
    assert check_command(root, "opsctl redeploy") == "`opsctl` has no command 'redeploy'"
    assert check_command(root, "opsctl lab sideways") == "`opsctl lab` has no command 'sideways'"
    assert check_command(root, "opsctl deploy --no-such-flag") == "`opsctl deploy` has no option --no-such-flag"
