"""What one service's deploy or rollback works with: the host and service, the connection, the HTTP client,
the cancel flag, the progress line and the hook run right before going live. The deploy steps (flow) and the
checks made before anything changes (guards) both take it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from opsctl import systemd
from opsctl.commands import Cmd
from opsctl.deploy.release import ServicePaths
from opsctl.inventory.model import Host, Service
from opsctl.kernel import audit
from opsctl.kernel.gate import Interrupted
from opsctl.remote.base import Connection

# Commands after the switch are short (systemctl, ln, install): one that takes longer means the host is gone
# or hung, and is reported like an unreachable host instead of waiting for the inventory's command timeout.
LIVE_TIMEOUT_S = 60.0


@dataclass
class ServiceContext:
    host: Host
    service: Service
    conn: Connection
    http: httpx.Client
    cancel: threading.Event
    say: Callable[[str], None]  # progress line (already prefixed by the caller)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    # Called once staging passed, right before the switch: takes the service out of its routers
    # (opsctl.rollout.rolling). An error there fails the deploy with nothing switched.
    before_live: Callable[[], None] | None = None

    @property
    def paths(self) -> ServicePaths:
        return ServicePaths(self.service.name)

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise Interrupted()

    def run(self, cmd: Cmd, check: bool = True, timeout: float | None = None) -> str:
        return self.conn.run(cmd, timeout=timeout, check=check).stdout

    def unit_state(self) -> systemd.UnitState:
        return systemd.parse_show(self.run(systemd.show_cmd(self.paths.unit_name), timeout=LIVE_TIMEOUT_S))

    def audit_local(self, action: str, release_id: str | None, result: str, detail: str = "") -> str:
        """The control machine's line only (the host is unreachable)."""
        return audit.record(self.host, self.service.name, action, release_id, result, detail)

    def audit(self, action: str, release_id: str | None, result: str, detail: str = "") -> None:
        audit.record(self.host, self.service.name, action, release_id, result, detail, conn=self.conn)
