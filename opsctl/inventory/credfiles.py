"""Credential files on the control machine (`ssh.key_file`, `api_key: file:PATH`), checked once when the
inventory loads: a file that its group or other users may access is refused with the chmod that fixes it, as
OpenSSH refuses such a private key ("UNPROTECTED PRIVATE KEY FILE!"). An inventory that sets
`credential_files: warn` at its top level gets one warning per file instead (a shared read-only mount, say).

SSH keys are judged as OpenSSH's `sshkey_perm_ok` judges them: only a key owned by the user running opsctl,
and any group/other bit counts. A secret file counts with any owner. A file that does not exist (or cannot be
stat'ed) is left to the command that reads it, which names it then. Pure but for `stat` and the uid, which
come in as arguments.
"""

from __future__ import annotations

import os
import shlex
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from opsctl.inventory.model import Inventory

KEY = "credential_files"


class CredentialFiles(StrEnum):
    REFUSE = "refuse"  # the default: the inventory does not load
    WARN = "warn"  # one warning per file, printed by every command


@dataclass(frozen=True)
class Loose:
    """A credential file its group or others may access."""

    where: str  # the inventory key that names it
    file: str
    mode: int  # permission bits
    ssh_key: bool

    @property
    def reason(self) -> str:
        who = "an SSH private key" if self.ssh_key else "a secret file"
        tail = " (OpenSSH refuses such a key)" if self.ssh_key else ""
        return f"{who}, {self.file} is mode {self.mode:04o}: its group or other users can access it{tail}"

    @property
    def fix(self) -> str:
        return f"chmod 600 {shlex.quote(self.file)}"


def loose_mode(st_mode: int, st_uid: int, uid: int, ssh_key: bool) -> bool:
    """Whether a file with this mode and owner is too open for a credential (OpenSSH's rule for keys)."""
    if ssh_key and st_uid != uid:
        return False
    return stat.S_IMODE(st_mode) & 0o077 != 0


def named_files(inventory: Inventory) -> Iterator[tuple[str, str, bool]]:
    """(inventory key, file, is an SSH key) for every credential file the inventory names."""
    for host in inventory.hosts:
        if host.ssh.key_file:
            yield f"hosts.{host.name}.ssh.key_file", host.ssh.key_file, True
        for service in host.services:
            if service.api_key is not None and service.api_key.source.startswith("file:"):
                yield f"hosts.{host.name}.services.{service.name}.api_key", service.api_key.source[5:], False
    for router in inventory.routers:
        if router.api_key is not None and router.api_key.source.startswith("file:"):
            yield f"routers.{router.name}.api_key", router.api_key.source[5:], False


def find_loose(
    inventory: Inventory,
    stat_fn: Callable[[str], os.stat_result] = os.stat,
    uid: int | None = None,
) -> list[Loose]:
    """Every credential file of the inventory that is too open, each file once (its first key)."""
    me = os.getuid() if uid is None else uid
    seen: set[str] = set()
    out = []
    for where, name, ssh_key in named_files(inventory):
        path = str(Path(name).expanduser())
        if path in seen:
            continue
        seen.add(path)
        try:
            st = stat_fn(path)
        except (OSError, ValueError):
            continue
        if loose_mode(st.st_mode, st.st_uid, me, ssh_key):
            out.append(Loose(where, path, stat.S_IMODE(st.st_mode), ssh_key))
    return out
