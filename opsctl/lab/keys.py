"""SSH identities of the lab: one client key pair, per-host host keys, and the lab known_hosts.

Host keys are generated here (not by the host at first boot), so known_hosts is exact before the first
connection and strict checking works from the start: no trust-on-first-use anywhere in the lab.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from opsctl.lab import system
from opsctl.lab.config import LabConfig
from opsctl.lab.state import HostRecord
from opsctl.localfiles import write_text_atomic


def ensure_client_key(cfg: LabConfig) -> None:
    cfg.ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(cfg.ssh_dir, 0o700)
    if not cfg.key_file.exists():
        system.run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "opsctl-lab", "-f", str(cfg.key_file))


def client_public_key(cfg: LabConfig) -> str:
    return Path(f"{cfg.key_file}.pub").read_text().strip()


def make_host_key(etc_ssh: Path, host: str) -> str:
    """Write a fresh ed25519 host key into the host's /etc/ssh; return the public line `type base64`."""
    key = etc_ssh / "ssh_host_ed25519_key"
    for old in etc_ssh.glob("ssh_host_*"):
        old.unlink()
    system.run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}", "-f", str(key))
    kind, blob, *_ = Path(f"{key}.pub").read_text().split()
    return f"{kind} {blob}"


def install_authorized_key(root: Path, public_key: str) -> None:
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(public_key + "\n")
    os.chmod(keys, 0o600)


def write_known_hosts(cfg: LabConfig, hosts: Iterable[HostRecord]) -> None:
    """Exactly the running lab's hosts: `address keytype base64` per line (port 22)."""
    lines = [f"{h.address} {h.host_key}\n" for h in sorted(hosts, key=lambda h: h.index) if h.host_key]
    write_text_atomic(cfg.known_hosts, "".join(lines))
