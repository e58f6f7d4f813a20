"""The ddtree-runtime wheel, the one artifact every release installs: built once per run on the control machine
(cached by a hash of the runtime's sources), kept on each host at a content-addressed path, pushed when absent.

Provision (the `runtime_wheel` operation) and deploy (staging) both use this module: one builder, one layout
(`/opt/opsctl/wheels/<sha256[:16]>/<wheel>`), one check and one push. Wheels of one version built from
different sources never overwrite each other, and provision's push is the copy deploy installs from.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.errors import DeployError
from opsctl.ops.base import Action, Push, execute, read
from opsctl.ops.facts.manifest import sha256_file
from opsctl.remote.base import Connection

REMOTE_WHEELS = "/opt/opsctl/wheels"
RUNTIME_SRC = Path(__file__).resolve().parents[1] / "runtime"


def wheel_version(wheel_name: str) -> str:
    """`ddtree_runtime-0.1.0-py3-none-any.whl` -> `0.1.0`."""
    parts = wheel_name.split("-")
    return parts[1] if len(parts) >= 5 and wheel_name.endswith(".whl") else "unknown"


def remote_wheel_path(wheel_name: str, sha256: str) -> str:
    """Where a wheel lives on a host, content-addressed: `<REMOTE_WHEELS>/<sha256[:16]>/<wheel>`."""
    return f"{REMOTE_WHEELS}/{sha256[:16]}/{wheel_name}"


@dataclass(frozen=True)
class RuntimeWheel:
    path: Path  # on the control machine
    sha256: str

    @staticmethod
    def of(path: Path) -> RuntimeWheel:
        return RuntimeWheel(path, sha256_file(path))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def version(self) -> str:
        return wheel_version(self.path.name)

    @property
    def remote_path(self) -> str:
        return remote_wheel_path(self.path.name, self.sha256)


# ---------------------------------------------------------------- build


def _source_hash(src: Path) -> str:
    digest = hashlib.sha256()
    skip = ("__pycache__", ".egg-info", "build", "dist")
    files = sorted(p for p in src.rglob("*") if p.is_file() and not any(s in str(p.relative_to(src)) for s in skip))
    for path in files:
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
    found = sorted(target.glob("ddtree_runtime-*.whl")) if target.is_dir() else []
    if not found:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                 "--disable-pip-version-check", "-w", tmp, str(src)],
                capture_output=True, text=True,
            )  # fmt: skip
            built = sorted(Path(tmp).glob("ddtree_runtime-*.whl"))
            if proc.returncode != 0 or not built:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
                raise DeployError(f"building the runtime wheel failed: {tail[0]}", f"try: pip wheel --no-deps {src}")
            target.mkdir(parents=True, exist_ok=True)
            # beside, then renamed: a concurrent caller's glob sees the whole wheel or none (never half a file)
            partial = target / f".{built[0].name}.{os.getpid()}.partial"
            shutil.copy2(built[0], partial)
            os.replace(partial, target / built[0].name)
        found = sorted(target.glob("ddtree_runtime-*.whl"))
    return RuntimeWheel.of(found[-1])


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
