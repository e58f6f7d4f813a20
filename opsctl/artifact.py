"""The ddtree-runtime wheel, the one artifact every release installs: built once per run on the control machine
(cached by a hash of the runtime's sources), kept on each host at a content-addressed path, pushed when absent.

Provision (the `runtime_wheel` operation) and deploy (staging) both use this module: one builder, one layout
(`/opt/opsctl/wheels/<sha256[:16]>/<wheel>`), one check and one push. Wheels of one version built from
different sources never overwrite each other, and provision's push is the copy deploy installs from.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.errors import DeployError
from opsctl.ops.base import Action, Push, execute, read
from opsctl.remote.base import Connection
from opsctl.wheel import RuntimeWheel

RUNTIME_SRC = Path(__file__).resolve().parents[1] / "runtime"


# ---------------------------------------------------------------- build


def _is_build_output(relative: Path) -> bool:
    """Whether a path under runtime/ is a build's by-product (matched per path part: `ddtree/tiny/distill.py`
    and `ddtree/pairs/build.py` are sources, `build/` and `dist/` are not)."""
    return any(part in ("__pycache__", "build", "dist") or part.endswith(".egg-info") for part in relative.parts)


def _source_files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file() and not _is_build_output(p.relative_to(src)))


def _source_hash(src: Path) -> str:
    digest = hashlib.sha256()
    for path in _source_files(src):
        digest.update(str(path.relative_to(src)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    return Path.home() / ".cache" / "opsctl" / "wheels"


def runtime_wheel(explicit: Path | None = None, src: Path = RUNTIME_SRC) -> RuntimeWheel:
    """An explicit wheel file, or the runtime built from source (cached per source hash)."""
    if explicit is not None:
        if not explicit.is_file() or explicit.suffix != ".whl":
            raise DeployError(f"runtime wheel {explicit} is not a .whl file", "pass --runtime-wheel PATH.whl")
        return RuntimeWheel.of(explicit)
    if not (src / "pyproject.toml").is_file():
        raise DeployError(f"no runtime sources at {src}", "pass --runtime-wheel PATH.whl (a built ddtree-runtime)")
    target = cache_dir() / _source_hash(src)
    target.mkdir(parents=True, exist_ok=True)
    # one build per source hash: a concurrent caller (parallel test tiers, two opsctl runs) waits for it, then
    # takes the same wheel (pip's wheels carry build times, so two builds would give two sha256s, two releases)
    with (target / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(target.glob("ddtree_runtime-*.whl"))
        if not found:
            found = [_build_into(src, target)]
    return RuntimeWheel.of(found[-1])


def _build_into(src: Path, target: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        # built from a private copy: setuptools writes build/ and *.egg-info into the tree it builds
        copy = Path(tmp) / "src"
        for path in _source_files(src):
            (copy / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, copy / path.relative_to(src))
        out = Path(tmp) / "out"
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
             "--disable-pip-version-check", "-w", str(out), str(copy)],
            capture_output=True, text=True,
        )  # fmt: skip
        built = sorted(out.glob("ddtree_runtime-*.whl"))
        if proc.returncode != 0 or not built:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise DeployError(f"building the runtime wheel failed: {tail[0]}", f"try: pip wheel --no-deps {src}")
        # beside, then renamed: a reader that does not take the lock sees the whole wheel or none
        partial = target / f".{built[0].name}.{os.getpid()}.partial"
        shutil.copy2(built[0], partial)
        os.replace(partial, target / built[0].name)
        return target / built[0].name


# ---------------------------------------------------------------- on a host


def check_cmd(wheel: RuntimeWheel) -> Cmd:
    """A read-only command: the sha256 of the host's copy (non-zero exit when it has none)."""
    return Cmd.of("sha256sum", wheel.remote_path)


def parse_sha256sum(exit_code: int, stdout: str) -> str | None:
    if exit_code != 0 or not stdout.strip():
        return None
    digest = stdout.split()[0]
    return digest if len(digest) == 64 else None


def on_host(conn: Connection, wheel: RuntimeWheel) -> bool:
    """Whether the host already holds this exact wheel at its content-addressed path."""
    result = read(conn, check_cmd(wheel))
    return parse_sha256sum(result.exit_code, result.stdout) == wheel.sha256


def push_actions(wheel: RuntimeWheel) -> tuple[Action, ...]:
    return (Cmd.of("mkdir", "-p", posixpath.dirname(wheel.remote_path), sudo=True), Push(wheel.path, wheel.remote_path))


def ensure_on_host(conn: Connection, wheel: RuntimeWheel) -> bool:
    """Push the wheel unless the host already has it (same sha256). True when pushed."""
    if on_host(conn, wheel):
        return False
    execute(conn, push_actions(wheel))
    return True
