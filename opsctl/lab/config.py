"""Where the lab keeps things, and its address range. One frozen value passed to every lab function."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

# Debian packages inside every lab host (the rootfs); the cache key covers this list.
ROOTFS_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-venv",
    "python3-pip",
    "iproute2",
    "procps",
    "sudo",
    "rsync",
)
# Bump when the rootfs preparation (opsctl.lab.rootfs.prepare) changes: a new cache directory is built.
ROOTFS_RECIPE = 1


@dataclass(frozen=True)
class LabConfig:
    subnet: ipaddress.IPv4Network = field(default_factory=lambda: ipaddress.IPv4Network("10.213.0.0/24"))
    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    cache_dir: Path = Path("/var/cache/opsctl/lab")  # rootfs cache (read-only lower layer of every host)
    root_dir: Path = Path("/var/lib/opsctl/lab")  # per-host overlay dirs, the lab SSH key, known_hosts
    state_dir: Path = Path("/run/opsctl-lab")  # state.json + lock: what exists, so `down` works after a crash
    inventory_path: Path = Path("inventory/lab.yaml")
    shm_size: str = "2G"  # /dev/shm tmpfs size inside each host (models are copied there)
    boot_timeout: float = 90.0  # seconds for a host to answer SSH and reach running/degraded
    prefix: str = "olab"  # names of the bridge, namespaces, veths and containers (interfaces: <= 15 chars)

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        """The control machine's address on the lab bridge."""
        return self.subnet.network_address + 1

    def address(self, index: int) -> ipaddress.IPv4Address:
        """Host N (1-based) is at .10+N."""
        address = self.subnet.network_address + 10 + index
        if address not in self.subnet or address == self.subnet.broadcast_address:
            raise ValueError(f"host {index} does not fit in {self.subnet}")
        return address

    @property
    def bridge(self) -> str:
        return f"{self.prefix}0"

    def netns(self, host: str) -> str:
        """Also the container's machine name and the control-side veth name."""
        return f"{self.prefix}-{host}"[:15]

    @property
    def ssh_dir(self) -> Path:
        return self.root_dir / "ssh"

    @property
    def key_file(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def hosts_dir(self) -> Path:
        return self.root_dir / "hosts"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"


def host_name(index: int) -> str:
    return f"lab{index}"
