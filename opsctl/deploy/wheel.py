"""The ddtree-runtime wheel that every release installs: built once per run on the control machine (cached by
a hash of the runtime's sources) and pushed to /opt/opsctl/wheels/<sha16>/ on each host when it is not there yet."""

from __future__ import annotations

import hashlib
import posixpath
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opsctl.commands import Cmd
from opsctl.deploy.release import wheel_version
from opsctl.errors import DeployError
from opsctl.remote.base import Host

REMOTE_WHEELS = "/opt/opsctl/wheels"


def remote_wheel_path(wheel_name: str, sha256: str) -> str:
    """Where a wheel lives on a host, content-addressed (`<sha256[:16]>/<wheel>`): builds of one version from
    different sources never overwrite each other, and provision's push is the copy deploy installs from."""
    return f"{REMOTE_WHEELS}/{sha256[:16]}/{wheel_name}"


RUNTIME_SRC = Path(__file__).resolve().parents[2] / "runtime"


@dataclass(frozen=True)
class RuntimeWheel:
    path: Path
    sha256: str

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def version(self) -> str:
        return wheel_version(self.path.name)

    @property
    def remote_path(self) -> str:
        return remote_wheel_path(self.path.name, self.sha256)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
        return RuntimeWheel(explicit, sha256_file(explicit))
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
            shutil.copy2(built[0], target / built[0].name)
        found = sorted(target.glob("ddtree_runtime-*.whl"))
    return RuntimeWheel(found[-1], sha256_file(found[-1]))


def ensure_on_host(host: Host, wheel: RuntimeWheel) -> bool:
    """Push the wheel unless the host already has it (same sha256). True when pushed."""
    check = host.run(Cmd.of("sha256sum", "--", wheel.remote_path, sudo=True), check=False)
    if check.ok and check.stdout.split()[:1] == [wheel.sha256]:
        return False
    host.run(Cmd.of("mkdir", "-p", posixpath.dirname(wheel.remote_path), sudo=True))
    host.put_file(wheel.path, wheel.remote_path, 0o644)
    return True
