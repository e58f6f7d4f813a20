"""Requirement locks: which packages (and which torch build) a host's venv gets.

A lock is a pip requirements file under locks/ at the repository root, or the copy an installed opsctl carries
(`opsctl.bundle`; OPSCTL_LOCKS_DIR overrides):
`reference-cpu.txt` for hosts that run only the reference engine, `sglang-<version>.txt` for SGLang hosts.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from opsctl import bundle
from opsctl.errors import ProvisionError
from opsctl.inventory.model import Engine, Host


class Profile(StrEnum):
    REFERENCE = "reference"  # torch CPU, transformers, fastapi, uvicorn (the runtime's own server)
    SGLANG = "sglang"  # pinned SGLang + its torch, sglang-kernel and flashinfer
    ROUTER = "router"  # sglang-router and its launcher's imports, installed per router release


@dataclass(frozen=True)
class Lock:
    profile: Profile
    name: str  # file name under locks/
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def requirements(self) -> tuple[str, ...]:
        """The requirement lines (no comments, no pip options)."""
        lines = (line.split("#", 1)[0].strip() for line in self.text.splitlines())
        return tuple(line for line in lines if line and not line.startswith("-"))


def locks_dir() -> Path:
    env = os.environ.get("OPSCTL_LOCKS_DIR")
    return Path(env) if env else bundle.locks_dir()


def profile_for(host: Host) -> Profile:
    if any(svc.engine is Engine.SGLANG for svc in host.services):
        return Profile.SGLANG
    return Profile.REFERENCE


def lock_for(host: Host, directory: Path | None = None) -> Lock:
    profile = profile_for(host)
    name = "reference-cpu.txt" if profile is Profile.REFERENCE else f"sglang-{host.sglang_version}.txt"
    path = (directory or locks_dir()) / name
    try:
        text = path.read_text()
    except OSError:
        raise ProvisionError(
            f"{host.name}: no requirement lock {path}",
            f"write {name} (exact pins for sglang=={host.sglang_version} and its torch) or fix sglang_version",
        ) from None
    return Lock(profile, name, text)


def router_lock(version: str, directory: Path | None = None) -> Lock:
    """`sglang-router-<version>.txt`: what a router release installs into its own site dir."""
    name = f"sglang-router-{version}.txt"
    path = (directory or locks_dir()) / name
    try:
        text = path.read_text()
    except OSError:
        raise ProvisionError(
            f"no requirement lock {path} for sglang-router {version}",
            f"write {name} (exact pins, as `pip download sglang-router=={version}` resolves them) or fix the version",
        ) from None
    return Lock(Profile.ROUTER, name, text)
