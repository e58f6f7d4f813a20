"""Connections held for a whole run: one per host, opened on first use, all closed at the end."""

from __future__ import annotations

from collections.abc import Callable

from opsctl.errors import OpsctlError
from opsctl.inventory.model import Host, Inventory
from opsctl.remote.base import Connection


class HeldConnections:
    def __init__(self, inventory: Inventory, connect: Callable[[Host], Connection]) -> None:
        self.inventory = inventory
        self.connect = connect
        self._conns: dict[str, Connection] = {}

    def get(self, host: str) -> Connection:
        if host not in self._conns:
            self._conns[host] = self.connect(self.inventory.host(host))
        return self._conns[host]

    def close(self) -> None:
        """Close every connection; a host that is gone by now is no error."""
        for conn in self._conns.values():
            try:
                conn.close()
            except OpsctlError:
                pass
        self._conns.clear()
