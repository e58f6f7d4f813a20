"""router_wheels: the wheels of sglang-router (and what it imports) on every host that runs a router.

Routers are installed per release (`pip install --no-index --find-links ROUTER_WHEELHOUSE --target
<release>/site -r <lock>`, opsctl.router.deploy), so provision only puts the offline wheelhouse there: built
once on the control machine from `locks/sglang-router-<version>.txt` (opsctl.wheelhouse, stamped) and pushed
when the host's copy of the stamp differs. Hosts that run no router get nothing (one note).
"""

from __future__ import annotations

from pathlib import Path

from opsctl.commands import Cmd
from opsctl.ops.base import Context, Plan, Push, execute, read
from opsctl.wheelhouse import STAMP

NAME = "router_wheels"
REMOTE_ROUTER_WHEELHOUSE = "/var/cache/opsctl/router-wheelhouse"


def plan_router_wheels(local: Path | None, local_stamp: str, remote_stamp: str | None) -> Plan:
    if local is None:
        return Plan(NAME, notes=("no router on this host",))
    if remote_stamp is not None and remote_stamp.strip() == local_stamp.strip():
        return Plan(NAME, notes=(f"{REMOTE_ROUTER_WHEELHOUSE} is current",))
    actions = (Cmd.of("mkdir", "-p", REMOTE_ROUTER_WHEELHOUSE, sudo=True), Push(local, REMOTE_ROUTER_WHEELHOUSE))
    files = len(list(local.glob("*.whl")))
    return Plan(NAME, actions=actions, notes=(f"push {files} router wheels from {local}",))


def local_stamp(local: Path) -> str:
    try:
        return (local / STAMP).read_text()
    except OSError:
        return ""


class RouterWheels:
    name = NAME

    def plan(self, ctx: Context) -> Plan:
        local = ctx.artifacts.router_wheelhouses.get(ctx.spec.name)
        if local is None:
            return plan_router_wheels(None, "", None)
        result = read(ctx.remote, Cmd.of("cat", f"{REMOTE_ROUTER_WHEELHOUSE}/{STAMP}"))
        stamp = local_stamp(local)
        return plan_router_wheels(local, stamp, result.stdout if result.exit_code == 0 and stamp else None)

    def apply(self, ctx: Context, plan: Plan) -> Plan:
        execute(ctx.remote, plan.actions, timeout=1800.0)
        return self.plan(ctx)
