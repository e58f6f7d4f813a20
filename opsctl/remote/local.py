"""The control machine as a Host: the same interface, run with subprocess."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.errors import CommandTimeout, RemoteError
from opsctl.remote import base
from opsctl.remote.base import RunResult

log = logging.getLogger("opsctl.remote")


class LocalHost:
    """Runs commands on this machine. Each command gets its own session (process group), so a timeout or
    Ctrl-C kills everything it started."""

    def __init__(self, name: str = "local") -> None:
        self.name = name

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    def run(self, cmd: Cmd, timeout: float | None = None, check: bool = True) -> RunResult:
        line = base.command_line(self.name, cmd, self.as_root)
        display = cmd.display()
        log.debug("%s: run %s", self.name, display)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        stdin: str | None = cmd.stdin if cmd.stdin is not None else ""
        with subprocess.Popen(
            ["/bin/sh", "-c", line],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: a timeout or Ctrl-C kills all it started
        ) as proc:
            try:
                while True:
                    remaining = base.POLL_S if deadline is None else min(base.POLL_S, deadline - time.monotonic())
                    try:
                        out, err = proc.communicate(stdin, timeout=max(remaining, 0.0))
                        break
                    except subprocess.TimeoutExpired:
                        stdin = None  # already sent
                        if base.CANCEL.is_set():
                            raise KeyboardInterrupt from None
                        if deadline is not None and time.monotonic() >= deadline:
                            raise CommandTimeout(self.name, display, timeout or 0) from None
            except BaseException:
                _kill_group(proc)
                raise
        result = RunResult(self.name, display, proc.returncode, out, err, time.monotonic() - start)
        return base.checked(result, check)

    def put_text(self, text: str, remote_path: str, mode: int = 0o644) -> None:
        path = Path(remote_path)
        tmp = Path(base.temp_name(remote_path))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_file(self, local: Path, remote_path: str, mode: int = 0o644) -> None:
        tmp = Path(base.temp_name(remote_path))
        try:
            shutil.copyfile(local, tmp)
            os.chmod(tmp, mode)
            os.replace(tmp, remote_path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get_text(self, remote_path: str) -> str:
        try:
            return Path(remote_path).read_text()
        except OSError as exc:
            raise RemoteError(self.name, f"read {remote_path}", None, message=f"{self.name}: {exc}") from None

    def sync_dir(self, local_dir: Path, remote_dir: str, progress: Callable[[str], None] | None = None) -> None:
        Path(remote_dir).mkdir(parents=True, exist_ok=True)
        self.run(Cmd.of("rsync", "-a", "--", str(local_dir).rstrip("/") + "/", remote_dir.rstrip("/") + "/"))

    def close(self) -> None:
        pass


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    except ProcessLookupError:
        pass
