"""Routers on a host that the inventory no longer names: found (for `opsctl status`) and removed (`opsctl
router remove`).

Removal is an explicit command, not the inventory's silence: a router is the one address its clients use, and
an inventory that lost a router's entry (a bad merge, the wrong file, a lab inventory pointed at production)
must not cut every client off on the next deploy. So a router missing from the inventory keeps running, and
`status` names it, exits 1, and prints the command that removes it. The command refuses a router the
inventory still names (the next deploy would bring it back) and takes the host's deploy lock.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from opsctl import layout, systemd
from opsctl.commands import Cmd, sh
from opsctl.deploy.lock import host_lock
from opsctl.errors import DeployError, OpsctlError
from opsctl.inventory.model import Host, Inventory
from opsctl.kernel import audit
from opsctl.remote.base import Connect, Connection
from opsctl.remote.pool import run_parallel
from opsctl.router.keptout import kept_out_file
from opsctl.router.status import state_file

PREFIX = "router-"  # Router.unit_base: /opt/opsctl/services/router-<name>, opsctl-router-<name>.service
_DIR = re.compile(r"router-([a-z0-9][a-z0-9_-]{0,39})")


@dataclass(frozen=True)
class Orphan:
    host: str
    router: str
    unit: str  # "active/running", "inactive/dead", "?"

    def hint(self) -> str:
        return f"`opsctl router remove {self.router} --host {self.host} -i INVENTORY` stops and removes it"


@dataclass
class RemoveResult:
    host: str
    router: str
    removed: bool
    plan: list[str] = field(default_factory=list)
    message: str = ""


def installed_cmd() -> Cmd:
    """A fact read: the routers with a release tree on the host, one directory name a line."""
    return sh(f"ls -1 {layout.SERVICES_ROOT} 2>/dev/null | grep -E '^{PREFIX}' || true")


def parse_installed(stdout: str) -> list[str]:
    """Router names from `installed_cmd`'s output (anything not shaped like a router name is ignored)."""
    return sorted({m.group(1) for line in stdout.splitlines() if (m := _DIR.fullmatch(line.strip()))})


def orphans_of(inventory: Inventory, host: str, installed: list[str]) -> list[str]:
    """Routers installed on `host` that the inventory does not place there. Pure."""
    named = {r.name for r in inventory.routers if r.host == host}
    return [name for name in installed if name not in named]


def find_orphans(conn: Connection, inventory: Inventory, host: Host) -> list[Orphan]:
    names = orphans_of(inventory, host.name, parse_installed(conn.run(installed_cmd(), check=False).stdout))
    out = []
    for name in names:
        unit = systemd.parse_show(conn.run(systemd.show_cmd(layout.unit_name(PREFIX + name)), check=False).stdout)
        out.append(Orphan(host.name, name, f"{unit.active_state}/{unit.sub_state}"))
    return out


def collect_orphans(inventory: Inventory, hosts: list[Host], connect: Connect, forks: int = 16) -> list[Orphan]:
    """`find_orphans` on each host, in parallel; an unreachable host is skipped (status reports it already)."""

    def one(host: Host) -> list[Orphan]:
        conn = connect(host)
        try:
            return find_orphans(conn, inventory, host)
        finally:
            conn.close()

    return [o for out in run_parallel(hosts, key=lambda h: h.name, fn=one, forks=forks) for o in out.value or []]


def removal_cmds(router: str) -> list[Cmd]:
    """Stop and disable the unit, remove it, the router's releases, its last canary's state and its kept-out
    workers, reload systemd; in this order."""
    base = PREFIX + router
    return [
        systemd.disable_now_cmd(layout.unit_name(base)),
        Cmd.of("rm", "-f", "--", layout.unit_path(base), sudo=True),
        Cmd.of("rm", "-rf", "--", layout.service_root(base), sudo=True),
        Cmd.of("rm", "-f", "--", state_file(router), sudo=True),
        Cmd.of("rm", "-f", "--", kept_out_file(router), sudo=True),
        systemd.daemon_reload_cmd(),
        sh(f"systemctl reset-failed -- {layout.unit_name(base)} 2>/dev/null || true", sudo=True),
    ]


def remove(
    conn: Connection, inventory: Inventory, host: Host, router: str, plan: bool, say: Callable[[str], None]
) -> RemoveResult:
    """Remove a router the inventory no longer names from `host` (`plan`: only say what would run)."""
    if router not in orphans_of(inventory, host.name, [router]):
        raise DeployError(
            f"router {router} on {host.name} is still in the inventory ({inventory.path}): the next deploy "
            "would install it again",
            "delete it from the inventory's routers: (or move it to another host) first, then run this again",
        )
    if router not in parse_installed(conn.run(installed_cmd(), check=False).stdout):
        return RemoveResult(host.name, router, False, message=f"no router {router} on {host.name}: nothing to do")
    cmds = removal_cmds(router)
    if plan:
        return RemoveResult(host.name, router, False, [c.display() for c in cmds], f"would remove router {router}")
    with host_lock(conn, f"router remove {router}"):
        say(f"{host.name}: stopping and removing router {router}")
        _audit(conn, host, router, "started", "")
        try:
            for cmd in cmds:
                conn.run(cmd, timeout=60)
        except OpsctlError as exc:
            _audit(conn, host, router, "failed", exc.one_line())
            raise
        _audit(conn, host, router, "ok", "")
    return RemoveResult(host.name, router, True, message=f"router {router} stopped and removed")


def _audit(conn: Connection, host: Host, router: str, result: str, detail: str) -> None:
    audit.record(host, PREFIX + router, "router-remove", None, result, detail, conn=conn)
