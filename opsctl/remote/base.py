"""The remote seam: what every connection (SSH, local, fake) offers, and the shared pieces.

`Connection.run` takes a `Cmd` value. Its shell form is built here once (`command_line`), so every implementation
applies sudo and the secret rule the same way: a `Masked` argument never reaches a command line; secrets
travel on stdin or in a 0600 file written by `put_text`.
"""

from __future__ import annotations

import secrets
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from opsctl.commands import Cmd
from opsctl.errors import OpsctlError, RemoteError
from opsctl.inventory.model import Host

# Set by the pool when Ctrl-C arrives; a running command notices it within a poll interval, kills its remote
# process group and raises KeyboardInterrupt (worker threads never get the signal themselves).
CANCEL = threading.Event()

# Polling interval of the command wait loops (seconds): the latency of timeouts and cancellation.
POLL_S = 0.1


class SecretOnCommandLine(OpsctlError):
    """A command carried a Masked argument: it would be visible in the remote process list."""

    def __init__(self, host: str, command: str) -> None:
        super().__init__(
            f"{host}: refusing to run `{command}`: a secret would appear on the command line",
            "pass the secret on stdin (Cmd.stdin) or in a 0600 file (put_text)",
        )


@dataclass(frozen=True)
class RunResult:
    host: str
    command: str  # display form (secrets masked)
    exit_code: int
    stdout: str = field(repr=False)
    stderr: str = field(repr=False)
    duration: float  # seconds

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def tail(self) -> str:
        """The last lines of output, for error messages."""
        text = (self.stdout.rstrip() + "\n" + self.stderr.rstrip()).strip()
        return "\n".join(text.splitlines()[-10:])


@runtime_checkable
class Connection(Protocol):
    """A connection to one host (SSH, the local machine, or a fake): what every command runs through."""

    name: str

    def run(self, cmd: Cmd, timeout: float | None = None, check: bool = True) -> RunResult: ...

    def put_text(self, text: str, remote_path: str, mode: int = 0o644) -> None: ...

    def put_file(self, local: Path, remote_path: str, mode: int = 0o644) -> None: ...

    def get_text(self, remote_path: str) -> str: ...

    def sync_dir(self, local_dir: Path, remote_dir: str) -> None: ...

    def close(self) -> None: ...


Connect = Callable[[Host], Connection]  # how every command gets its connection (injected; tests pass a fake)


def command_line(host: str, cmd: Cmd, as_root: bool) -> str:
    """The shell string to execute for `cmd`; refuses secrets; wraps in `sudo -n` when needed.

    `sudo -n sh -c '...'` (not `sudo argv...`) so shell operators in Raw arguments stay under sudo.
    """
    if cmd.has_secrets:
        raise SecretOnCommandLine(host, cmd.display())
    line = cmd.shell()
    if cmd.sudo and not as_root:
        line = "sudo -n -- sh -c " + shlex.quote(line)
    return line


def checked(result: RunResult, check: bool) -> RunResult:
    """Raise RemoteError for a non-zero exit when `check`."""
    if check and not result.ok:
        raise RemoteError(result.host, result.command, result.exit_code, result.tail)
    return result


def temp_name(remote_path: str) -> str:
    """A sibling temporary name for atomic writes (same directory, so rename is atomic)."""
    directory, _, base = remote_path.rpartition("/")
    return f"{directory}/.{base}.opsctl-tmp-{secrets.token_hex(4)}"
