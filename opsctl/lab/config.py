"""Where the lab keeps things, and its address range. One frozen value passed to every lab function."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
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


# Lab N (1-9) beside the default one: `opsctl lab` and scripts/lab-journey read it from the environment, and the
# lab tests derive their labs from it (tests/lab/lab_parts.py), so two checkouts (or a journey and a test run) on
# one machine never share a subnet, a name, a state dir or a host dir.
SLOT_ENV = "OPSCTL_LAB_SLOT"
SLOTS = tuple(str(n) for n in range(1, 10))


def slot_config(slot: str, base: LabConfig | None = None) -> LabConfig:
    """`base` (the default lab) moved to slot `slot` ("" keeps it): subnet 10.22N.0.0/24, prefix olabN,
    /var/lib/opsctl/lab-N and /run/opsctl-lab-N. The inventory path is the caller's."""
    base = base or LabConfig()
    if not slot:
        return base
    if slot not in SLOTS:
        raise ValueError(f"a lab slot is one digit 1-9, got {slot[:20]!r}")
    return dataclasses.replace(
        base,
        subnet=ipaddress.IPv4Network(f"10.{220 + int(slot)}.0.0/24"),
        root_dir=base.root_dir.with_name(f"{base.root_dir.name}-{slot}"),
        state_dir=base.state_dir.with_name(f"{base.state_dir.name}-{slot}"),
        prefix=f"{base.prefix}{slot}",
    )


def env_slot() -> str:
    """OPSCTL_LAB_SLOT as given ("" when unset); `slot_config` refuses a value that is not one digit 1-9."""
    return os.environ.get(SLOT_ENV, "")


def host_name(index: int) -> str:
    return f"lab{index}"
