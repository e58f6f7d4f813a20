"""A fake Host for unit tests: records every call, answers from a table keyed by the command's display form."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.errors import OpsctlError, RemoteError
from opsctl.remote import base
from opsctl.remote.base import RunResult

Answer = tuple[int, str, str] | OpsctlError  # (exit, stdout, stderr), or an error to raise


@dataclass
class FakeHost:
    name: str = "fake"
    answers: Mapping[str, Answer] = field(default_factory=dict)
    default: Answer | None = (0, "", "")  # for unknown commands; None = raise KeyError (strict tests)
    handler: Callable[[Cmd], Answer | None] | None = None  # consulted before `answers`
    as_root: bool = True
    commands: list[Cmd] = field(default_factory=list)  # every command run, in order
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # remote path -> (text, mode)
    synced: list[tuple[Path, str]] = field(default_factory=list)
    closed: bool = False

    @property
    def ran(self) -> list[str]:
        """Display forms of the commands run, in order."""
        return [c.display() for c in self.commands]

    def run(self, cmd: Cmd, timeout: float | None = None, check: bool = True) -> RunResult:
        base.command_line(self.name, cmd, self.as_root)  # same refusal of secrets as the real hosts
        self.commands.append(cmd)
        display = cmd.display()
        answer = self.handler(cmd) if self.handler else None
        if answer is None:
            answer = self.answers.get(display, self.default)
        if answer is None:
            raise KeyError(f"FakeHost {self.name}: no answer for `{display}`")
        if isinstance(answer, OpsctlError):
            raise answer
        code, out, err = answer
        return base.checked(RunResult(self.name, display, code, out, err, 0.0), check)

    def put_text(self, text: str, remote_path: str, mode: int = 0o644) -> None:
        self.files[remote_path] = (text, mode)

    def put_file(self, local: Path, remote_path: str, mode: int = 0o644) -> None:
        self.files[remote_path] = (local.read_text(errors="replace"), mode)

    def get_text(self, remote_path: str) -> str:
        if remote_path not in self.files:
            tail = f"cat: {remote_path}: No such file or directory"
            raise RemoteError(self.name, f"cat -- {remote_path}", 1, tail)
        return self.files[remote_path][0]

    def sync_dir(self, local_dir: Path, remote_dir: str, progress: Callable[[str], None] | None = None) -> None:
        self.synced.append((local_dir, remote_dir))

    def close(self) -> None:
        self.closed = True
