"""Deploy or roll back routers, each on its host under that host's deploy lock (one after another: a fleet has
few routers, and each restart is an outage its clients feel, so they are never restarted all at once)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httpx

from opsctl import remote
from opsctl.deploy.lock import LockHeld, host_lock
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.release import DEFAULT_KEEP
from opsctl.errors import OpsctlError, UnreachableError
from opsctl.inventory.model import Inventory, Router
from opsctl.remote.base import Connect
from opsctl.router.deploy import RouterDeploy, RouterResult


def run_routers(
    inventory: Inventory,
    routers: Sequence[Router],
    action: str,  # deploy | rollback
    say: Callable[[str], None],
    force: bool = False,
    plan: bool = False,
    keep: int = DEFAULT_KEEP,
    to: str | None = None,
    lock_wait: float = 0.0,
    connect: Connect = remote.connect,
) -> list[RouterResult]:
    results = []
    for router in routers:
        host = inventory.host(router.host)
        prefix = f"{host.name}/router {router.name}: "

        def said(message: str, prefix: str = prefix) -> None:
            say(prefix + message)

        try:
            conn = connect(host)
            try:
                with httpx.Client() as http:
                    job = RouterDeploy(inventory, router, conn, http, said)
                    if plan:
                        results.append(job.deploy(force=force, plan=True, keep=keep))
                        continue
                    with host_lock(conn, f"{action} router {router.name}", lock_wait):
                        results.append(job.deploy(force=force, keep=keep) if action == "deploy" else job.rollback(to))
            finally:
                conn.close()
        except LockHeld as exc:
            results.append(RouterResult(host.name, router.name, Outcome.LOCKED, message=exc.one_line()))
        except UnreachableError as exc:
            results.append(RouterResult(host.name, router.name, Outcome.UNREACHABLE, message=exc.one_line()))
        except OpsctlError as exc:
            results.append(RouterResult(host.name, router.name, Outcome.FAILED, message=exc.one_line()))
    return results
