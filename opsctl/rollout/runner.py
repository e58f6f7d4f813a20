"""Runs deploys and rollbacks across hosts: connections, per-host locks, canary/batches/max-fail, Ctrl-C.

Its own thread pool (not remote.run_parallel): on Ctrl-C the workers must still run commands (switch back to
the previous release, restart it, release the lock), so cancellation is an Event the deploy flow checks
between steps and inside the gates, never a kill of in-flight commands.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from opsctl import remote
from opsctl.deploy.context import ServiceContext
from opsctl.deploy.flow import DeploySettings, ServiceResult, deploy_service, rollback_service
from opsctl.deploy.lock import LockHeld, host_lock
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.staged import StagedRelease
from opsctl.errors import DeployError, ExitCode, OpsctlError, UnreachableError
from opsctl.inventory.model import Host, Service
from opsctl.kernel import audit
from opsctl.remote.base import Connect, Connection
from opsctl.rollout.plan import Target, count_failures, group_by_host, plan_batches, should_continue
from opsctl.rollout.rolling import RouterGuard, Taken
from opsctl.secrets import SecretError
from opsctl.wheel import RuntimeWheel


@dataclass(frozen=True)
class RolloutOptions:
    canary: bool = False
    batch: int | None = None  # targets per batch after the canary; None = all at once
    max_fail: int = 0  # stop starting new batches once cumulative failures exceed this
    lock_wait: float = 0.0  # seconds to wait for a held host lock
    forks: int = 16


@dataclass
class RunReport:
    action: str  # deploy | rollback
    results: list[ServiceResult] = field(default_factory=list)
    interrupted: bool = False
    stopped_early: bool = False  # max-fail reached

    @property
    def failures(self) -> int:
        return count_failures([r.outcome for r in self.results])

    def exit_code(self, plan: bool = False) -> ExitCode:
        if self.interrupted:
            return ExitCode.INTERRUPTED
        if self.failures:
            return ExitCode.ERROR
        if plan and any(r.outcome is Outcome.PLANNED for r in self.results):
            return ExitCode.CHANGES_PENDING
        return ExitCode.OK


Work = Callable[[ServiceContext], ServiceResult]


def run(
    action: str,
    selection: Sequence[tuple[Host, Sequence[Service]]],
    work: Work,
    options: RolloutOptions,
    say: Callable[[str], None],
    connect: Connect = remote.connect,
    take_lock: bool = True,
    audit_refusals: bool = True,
) -> RunReport:
    """Apply `work` to every selected (host, service), in batches, each host under its deploy lock. A refusal
    (`work` raised: free space, an old API key, no rollback target, ...) is audited like the lock's, unless
    `audit_refusals` is off (--plan changes nothing, the audit logs included)."""
    report = RunReport(action)
    hosts = {h.name: h for h, _ in selection}
    services = {(h.name, s.name): s for h, svcs in selection for s in svcs}
    targets = [Target(h.name, s.name) for h, svcs in selection for s in svcs]
    batches = plan_batches(targets, options.canary, options.batch)
    cancel = threading.Event()
    conns: dict[str, Connection] = {}
    results: dict[Target, ServiceResult] = {}
    now = datetime.now(UTC)

    def on_host(host_name: str, group: list[Target]) -> list[ServiceResult]:
        host = hosts[host_name]
        out: list[ServiceResult] = []

        def rest(outcome: Outcome, message: str) -> list[ServiceResult]:
            done = {r.service for r in out}
            return [
                ServiceResult(host_name, t.service, outcome, message=message) for t in group if t.service not in done
            ]

        try:
            with ExitStack() as stack:
                conn = conns.setdefault(host_name, connect(host))
                if take_lock:
                    names = ",".join(t.service for t in group)
                    stack.enter_context(
                        host_lock(conn, f"{action} {names}", options.lock_wait, cancelled=cancel.is_set)
                    )
                http = stack.enter_context(httpx.Client())
                for target in group:
                    if cancel.is_set():
                        out.append(ServiceResult(host_name, target.service, Outcome.SKIPPED, message="interrupted"))
                        continue
                    svc = services[(host_name, target.service)]
                    ctx = ServiceContext(host, svc, conn, http, cancel, say=_prefixed(say, str(target)), now=now)
                    try:
                        out.append(work(ctx))
                    except UnreachableError as exc:
                        out.append(
                            ServiceResult(host_name, target.service, Outcome.UNREACHABLE, message=exc.one_line())
                        )
                    except OpsctlError as exc:
                        outcome = Outcome.INTERRUPTED if cancel.is_set() else Outcome.FAILED
                        out.append(ServiceResult(host_name, target.service, outcome, message=exc.one_line()))
                        if audit_refusals:
                            why = "refused" if isinstance(exc, DeployError) else "failed"
                            _audit_refusal(conn, host, [target.service], action, exc.one_line(), why)
        except LockHeld as exc:
            out += rest(Outcome.LOCKED, exc.one_line())
            _audit_refusal(conns.get(host_name), host, [r.service for r in out], action, exc.message)
        except UnreachableError as exc:
            out += rest(Outcome.UNREACHABLE, exc.one_line())
        except OpsctlError as exc:
            out += rest(Outcome.FAILED, exc.one_line())
        return out

    pool = ThreadPoolExecutor(max_workers=max(1, options.forks), thread_name_prefix="opsctl-deploy")
    try:
        for index, batch in enumerate(batches):
            if report.interrupted or not should_continue(
                count_failures([r.outcome for r in results.values()]), options.max_fail
            ):
                report.stopped_early = not report.interrupted
                for t in batch:
                    why = "interrupted" if report.interrupted else f"not started: more than {options.max_fail} failures"
                    results[t] = ServiceResult(t.host, t.service, Outcome.SKIPPED, message=why)
                continue
            if len(batches) > 1:
                say(f"batch {index + 1}/{len(batches)}: {', '.join(str(t) for t in batch)}")
            futures: dict[Future[list[ServiceResult]], str] = {
                pool.submit(on_host, host_name, group): host_name for host_name, group in group_by_host(batch).items()
            }
            pending = set(futures)
            while pending:
                try:
                    _, pending = wait(pending, timeout=0.2)
                except KeyboardInterrupt:
                    if not cancel.is_set():
                        say("interrupted: restoring previous releases and releasing locks (Ctrl-C again is ignored)")
                    cancel.set()
                    report.interrupted = True
            for future in futures:
                for r in future.result():
                    results[Target(r.host, r.service)] = r
    finally:
        pool.shutdown(wait=True)
        for conn in conns.values():
            try:
                conn.close()
            except Exception:  # closing is best effort
                pass
    report.results = [results[t] for t in targets if t in results]
    return report


def deploy(
    selection: Sequence[tuple[Host, Sequence[Service]]],
    wheel: RuntimeWheel,
    settings: DeploySettings,
    options: RolloutOptions,
    say: Callable[[str], None],
    connect: Connect = remote.connect,
    routers: RouterGuard | None = None,
) -> RunReport:
    """Deploy each selected service; one that a router fronts is taken out of it first (`routers`)."""
    try:
        require_secrets(selection)  # --plan too: a plan that says "unchanged" where the deploy fails would lie
    except DeployError as exc:
        if not settings.plan:  # no host touched: the control machine's log records the refusal
            for host, services in selection:
                for svc in services:
                    _audit_refusal(None, host, [svc.name], "deploy", exc.message, "refused")
        raise

    def work(ctx: ServiceContext) -> ServiceResult:
        if routers is None or not routers.fronted(ctx.host.name, ctx.service.name):
            return deploy_service(ctx, wheel, settings)
        if settings.plan:
            result = deploy_service(ctx, wheel, settings)
            if result.outcome is Outcome.PLANNED:
                result.plan.append(routers.plan_line(ctx.host.name, ctx.service.name))
            return result
        return behind_routers(ctx, routers, lambda: deploy_service(ctx, wheel, settings))

    return run("deploy", selection, work, options, say, connect, not settings.plan, not settings.plan)


def rollback(
    selection: Sequence[tuple[Host, Sequence[Service]]],
    settings: DeploySettings,
    options: RolloutOptions,
    say: Callable[[str], None],
    to: str | None = None,
    connect: Connect = remote.connect,
    routers: RouterGuard | None = None,
) -> RunReport:
    """Roll back each selected service; one behind a router is taken out and drained first, like a deploy."""

    def work(ctx: ServiceContext) -> ServiceResult:
        if routers is None or settings.plan or not routers.fronted(ctx.host.name, ctx.service.name):
            return rollback_service(ctx, settings, to)
        return behind_routers(ctx, routers, lambda: rollback_service(ctx, settings, to), (Outcome.UNREACHABLE,))

    return run("rollback", selection, work, options, say, connect, not settings.plan, not settings.plan)


def behind_routers(
    ctx: ServiceContext,
    routers: RouterGuard,
    work: Callable[[], ServiceResult],
    not_serving: tuple[Outcome, ...] = (Outcome.FAILED, Outcome.UNREACHABLE),
) -> ServiceResult:
    """`work` (a deploy or rollback) with the service out of its routers from the switch until it serves again.
    It goes back in when its /health answers and its outcome is not one of `not_serving` (a deploy's `failed`
    means nothing healthy serves; a rollback's `failed` restored the release that served before)."""
    host, svc = ctx.host.name, ctx.service.name
    taken: list[Taken] = []

    def take_out() -> None:
        taken.extend(routers.take_out(host, svc, ctx.say, ctx.cancel.is_set))

    ctx.before_live = take_out
    result: ServiceResult | None = None
    try:
        result = work()
        if not taken and result.outcome is Outcome.UNCHANGED:
            problem = routers.ensure_in(host, svc, ctx.say)  # e.g. left out by an earlier failed deploy
            if problem:
                result.outcome, result.message = Outcome.FAILED, f"{result.message}; {problem}"
        return result
    finally:
        if taken:
            serving = (result is None or result.outcome not in not_serving) and routers.serving(host, svc)
            problem = routers.put_back(taken, serving, ctx.say)
            if problem and result is not None:
                if result.outcome in (Outcome.DEPLOYED, Outcome.UNCHANGED):
                    result.outcome = Outcome.FAILED
                result.message = f"{result.message}; {problem}"


def require_secrets(selection: Sequence[tuple[Host, Sequence[Service]]]) -> None:
    """Every selected service's secrets readable before any host is touched: one missing env var found after
    the first batch went out would leave the fleet half deployed."""
    missing = []
    for host, services in selection:
        for svc in services:
            try:
                StagedRelease.render(host, svc).checked_secrets()
            except SecretError as exc:
                missing.append(f"{host.name}/{svc.name}: {exc.message}")
    if missing:
        raise DeployError(
            f"{len(missing)} service(s) lack a secret: {'; '.join(missing[:3])}; nothing was deployed",
            "set the variable or file named by the service's api_key, then deploy again",
        )


def _audit_refusal(
    conn: Connection | None, host: Host, services: list[str], action: str, why: str, result: str = "locked"
) -> None:
    """A refused deploy is an action too: who tried, and why (who held the lock, the guard that refused), in
    the control machine's log of the host's inventory and (when connected) on the host."""
    for svc in services:
        audit.record(host, svc, action, None, result, why, conn=conn)


def _prefixed(say: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda message: say(f"{prefix}: {message}")
