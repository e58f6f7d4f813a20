"""The offline wheelhouse: every wheel a host's lock needs, downloaded on the control machine with `pip download`.

Air-gapped GPU hosts and all lab hosts install from it (`pip install --no-index --find-links`). A built
wheelhouse carries a stamp (the lock's hash, the interpreter tag and the file list); a directory whose stamp
matches is reused as is, so only the first run downloads anything. Wheels are built for the control machine's
interpreter (CPython 3.11 on the lab); a host with another Python needs a wheelhouse built there.
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from opsctl import pip_index
from opsctl.errors import OpsctlError
from opsctl.kernel.locks import Lock
from opsctl.pip_index import Choice
from opsctl.progress import Ticker, human_bytes, run_streamed, stderr_line

CACHE_DIR = Path("/var/cache/opsctl/wheelhouse")  # what `opsctl lab up` declares as the lab's wheelhouse
STAMP = ".opsctl-wheelhouse.json"
LOCK_COPY = "requirements.txt"


class WheelhouseError(OpsctlError):
    pass


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    built: bool  # downloaded in this run (False: reused from the cache, or given by the user)
    files: tuple[str, ...]


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def wheel_files(directory: Path) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in directory.glob("*.whl")))


def stamp_matches(directory: Path, lock: Lock) -> bool:
    try:
        stamp = json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict)
        and stamp.get("lock_sha256") == lock.sha256
        and stamp.get("python") == python_tag()
        and stamp.get("files") == list(wheel_files(directory))
    )


PIP = (sys.executable, "-m", "pip")


def download_cmd(requirements: Path, dest: Path, pip: Sequence[str] = PIP) -> list[str]:
    return [
        *pip, "download", "--only-binary=:all:", "--progress-bar", "raw", "--dest", str(dest), "-r", str(requirements),
    ]  # fmt: skip


@dataclass
class DownloadState:
    """What `pip download`'s output said so far (fed line by line by `observe`)."""

    saved: int = 0
    current: str = ""  # the file being downloaded
    size: str = ""  # its size as pip printed it ("190.2 MB")
    got: int = 0  # bytes of it so far
    total: int = 0

    def detail(self) -> str:
        head = f"{self.saved} files saved"
        if not self.current:
            return head
        if self.total:
            return f"{head}; {self.current}: {human_bytes(self.got)} of {human_bytes(self.total)}"
        return f"{head}; {self.current}" + (f" ({self.size})" if self.size else "")


_DOWNLOADING = re.compile(r"^\s*Downloading (\S+)(?: \(([^)]*)\))?")
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")


def observe(state: DownloadState, line: str) -> bool:
    """Update `state` from one line of `pip download` output; True when it changed."""
    text = line.strip()
    if m := _PROGRESS.match(text):
        state.got, state.total = int(m[1]), int(m[2])
        return True
    if m := _DOWNLOADING.match(line):
        state.current, state.size, state.got, state.total = unquote(m[1].rsplit("/", 1)[-1]), m[2] or "", 0, 0
        return True
    if text.startswith("Saved ") or text.startswith("File was already downloaded"):
        state.saved += 1
        state.current = ""
        return True
    if text.startswith("Collecting "):
        state.current = ""
        return False
    return False


def ensure(
    lock: Lock,
    directory: Path,
    pip: Sequence[str] | None = None,
    indexes: Callable[[str], Choice] | None = None,
    out: Callable[[str], None] = stderr_line,
) -> Wheelhouse:
    """Return a wheelhouse for `lock`: reuse a matching one, else download into a staging dir and swap it in.

    A directory that holds wheels but no stamp was made by the user: it is used as given. Before downloading,
    every package index is probed (opsctl.pip_index): unreachable ones are skipped with a line on stderr;
    with none left the download stops at once with one line."""
    target = directory
    reused = _reusable(target, lock)
    if reused is not None:
        return reused
    target.parent.mkdir(parents=True, exist_ok=True)
    # One download per directory at a time (two provisions, or two test runs, sharing CACHE_DIR): the staging
    # dir is shared, so a second caller waits, then looks again and reuses what the first one built.
    with (target.parent / f".{target.name}.lock").open("w") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            out(f"wheelhouse {lock.name}: waiting for another download into {target}")
            fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
        reused = _reusable(target, lock)
        if reused is not None:
            return reused
        return _build(lock, target, pip, indexes, out)


def _reusable(target: Path, lock: Lock) -> Wheelhouse | None:
    """A wheelhouse stamped for this lock, or a user's directory of wheels (no stamp): used as is."""
    if stamp_matches(target, lock):
        return Wheelhouse(target, False, wheel_files(target))
    if target.is_dir() and not (target / STAMP).exists() and wheel_files(target):
        return Wheelhouse(target, False, wheel_files(target))
    return None


def _build(
    lock: Lock,
    target: Path,
    pip: Sequence[str] | None,
    indexes: Callable[[str], Choice] | None,
    out: Callable[[str], None],
) -> Wheelhouse:
    choice = (indexes or pip_index.decide)(lock.text)
    for note in choice.notes():
        out(f"wheelhouse {lock.name}: {note}")
    if choice.error is not None:
        raise WheelhouseError(
            f"wheelhouse for {lock.name}: {choice.error}",
            "fix the control machine's pip configuration (pip config list), or pass --wheelhouse DIR",
        )
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    requirements = staging / LOCK_COPY
    requirements.write_text(lock.text)
    pip_requirements = staging.with_name(staging.name + ".requirements.txt")
    pip_requirements.write_text(choice.requirements)
    try:
        cmd = download_cmd(pip_requirements, staging, pip or PIP)
        code, tail = _download(cmd, pip_index.child_env(choice), lock, out)
    finally:
        pip_requirements.unlink(missing_ok=True)
    if code != 0:
        shutil.rmtree(staging, ignore_errors=True)
        detail = next((ln for ln in reversed(tail) if "ERROR" in ln), tail[-1] if tail else "")
        skipped = f" (skipped: {', '.join(pip_index.shown(u) for u, _ in choice.skipped)})" if choice.skipped else ""
        raise WheelhouseError(
            f"pip download for {lock.name} failed: {detail.strip()}{skipped}",
            "check the control machine's package index (pip config list) or pass --wheelhouse DIR",
        )
    files = wheel_files(staging)
    stamp = {"lock": lock.name, "lock_sha256": lock.sha256, "python": python_tag(), "files": list(files)}
    (staging / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    return Wheelhouse(target, True, files)


def _download(cmd: list[str], env: dict[str, str], lock: Lock, out: Callable[[str], None]) -> tuple[int, list[str]]:
    """Run `pip download`, its output streamed into a progress line; (exit code, last lines of output)."""
    state = DownloadState()
    with Ticker(f"wheelhouse {lock.name}", out=out) as ticker:

        def on_line(line: str) -> None:
            if observe(state, line):
                ticker.update(state.detail())

        done = run_streamed(cmd, on_line, env=env, noise=lambda line: bool(_PROGRESS.match(line.strip())))
    return done.exit_code, list(done.tail)


def given(directory: Path) -> Wheelhouse:
    """A wheelhouse passed with --wheelhouse DIR: used as is."""
    if not directory.is_dir() or not wheel_files(directory):
        raise WheelhouseError(f"--wheelhouse {directory}: no .whl files there", "pass a directory of wheels")
    return Wheelhouse(directory, False, wheel_files(directory))
