"""Reboot a host and wait until it is back (a new boot id answers over SSH)."""

from __future__ import annotations

import time

from opsctl.commands import Cmd
from opsctl.errors import OpsctlError, ProvisionError
from opsctl.remote.base import Connection

BOOT_ID = Cmd.of("cat", "/proc/sys/kernel/random/boot_id")


def boot_id(remote: Connection) -> str:
    return remote.run(BOOT_ID, timeout=30.0).stdout.strip()


def reboot_and_wait(remote: Connection, timeout: float, poll: float = 5.0) -> None:
    before = boot_id(remote)
    try:
        remote.run(Cmd.of("systemctl", "reboot", sudo=True), timeout=30.0, check=False)
    except OpsctlError:
        pass  # the connection may drop before the command returns
    remote.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(poll)
        try:
            now = boot_id(remote)
        except OpsctlError:
            remote.close()  # reconnect on the next attempt
            continue
        if now and now != before:
            return
    raise ProvisionError(f"{remote.name}: not back over SSH {timeout:g}s after the reboot", "check the host's console")
