"""The lab's record of what it created, written before each resource is made, so `down` works after a crash.

state.json lives in cfg.state_dir; a lock file there serialises `up`/`down`/`status` of concurrent callers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from opsctl.errors import LabError
from opsctl.lab.config import LabConfig
from opsctl.localfiles import write_text_atomic


@dataclass(frozen=True)
class HostRecord:
    name: str
    index: int
    address: str
    netns: str
    veth: str
    dir: str  # per-host directory: upper/, work/, root/ (the overlay mount), console.log
    host_key: str = ""  # "ssh-ed25519 AAAA..." (public), recorded in the lab known_hosts
    pid: int | None = None  # systemd-nspawn
    start_time: int | None = None  # /proc/<pid>/stat field 22, so a recycled pid is never signalled

    @property
    def root(self) -> Path:
        return Path(self.dir) / "root"


@dataclass(frozen=True)
class LabState:
    subnet: str
    bridge: str
    rootfs: str = ""
    inventory: str = ""  # absolute path of the inventory file written by `up`
    hosts: dict[str, HostRecord] = field(default_factory=dict)

    def with_host(self, record: HostRecord) -> LabState:
        return replace(self, hosts={**self.hosts, record.name: record})

    def without_host(self, name: str) -> LabState:
        return replace(self, hosts={k: v for k, v in self.hosts.items() if k != name})


def load(cfg: LabConfig) -> LabState | None:
    try:
        data = json.loads(cfg.state_file.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LabError(f"lab state {cfg.state_file} is unreadable: {exc}", "run `opsctl lab down`") from None
    hosts = {name: HostRecord(**record) for name, record in data.pop("hosts", {}).items()}
    return LabState(**data, hosts=hosts)


def save(cfg: LabConfig, state: LabState) -> None:
    write_text_atomic(cfg.state_file, json.dumps(asdict(state), indent=2) + "\n")


def remove(cfg: LabConfig) -> None:
    cfg.state_file.unlink(missing_ok=True)


@contextlib.contextmanager
def locked(cfg: LabConfig) -> Iterator[None]:
    """One lab operation at a time on this machine."""
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    with (cfg.state_dir / "lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
