"""The ddtree-runtime wheel as a value: its file on the control machine, its sha256, and its content-addressed
place on a host. `opsctl.artifact` builds, checks and pushes it; provision and deploy pass it around.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opsctl.kernel.hashing import sha256_file

REMOTE_WHEELS = "/opt/opsctl/wheels"


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
