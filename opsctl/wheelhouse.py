"""The offline wheelhouse: every wheel a host's lock needs, downloaded on the control machine with `pip download`.

Air-gapped GPU hosts and all lab hosts install from it (`pip install --no-index --find-links`). A built
wheelhouse carries a stamp (the lock's hash, the interpreter tag and the file list); a directory whose stamp
matches is reused as is, so only the first run downloads anything. Wheels are built for the control machine's
interpreter (CPython 3.11 on the lab); a host with another Python needs a wheelhouse built there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from opsctl.errors import OpsctlError
from opsctl.ops.locks import Lock

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


def download_cmd(requirements: Path, dest: Path) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--dest", str(dest), "-r", str(requirements),
    ]  # fmt: skip


def ensure(lock: Lock, directory: Path) -> Wheelhouse:
    """Return a wheelhouse for `lock`: reuse a matching one, else download into a staging dir and swap it in.

    A directory that holds wheels but no stamp was made by the user: it is used as given."""
    target = directory
    if stamp_matches(target, lock):
        return Wheelhouse(target, False, wheel_files(target))
    if target.is_dir() and not (target / STAMP).exists() and wheel_files(target):
        return Wheelhouse(target, False, wheel_files(target))
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    requirements = staging / LOCK_COPY
    requirements.write_text(lock.text)
    cmd = download_cmd(requirements, staging)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        detail = next((ln for ln in reversed(lines) if "ERROR" in ln), lines[-1] if lines else "")
        raise WheelhouseError(
            f"pip download for {lock.name} failed: {detail.strip()}",
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


def given(directory: Path) -> Wheelhouse:
    """A wheelhouse passed with --wheelhouse DIR: used as is."""
    if not directory.is_dir() or not wheel_files(directory):
        raise WheelhouseError(f"--wheelhouse {directory}: no .whl files there", "pass a directory of wheels")
    return Wheelhouse(directory, False, wheel_files(directory))
