"""`opsctl provision`: run the provision playbook's steps (playbooks/provision.yaml, found by `opsctl.bundle`) on
every selected host, hosts in parallel.

Per host the steps run in order; the first failing step stops that host (later steps are reported skipped),
never the others. A step that needs a reboot stops the host too (exit 3) unless --reboot was given.
Things every host shares are prepared once on the control machine first: the wheelhouse(s), the runtime
wheel, and the manifests of control-side models.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import yaml

from opsctl import artifact, bundle, wheelhouse
from opsctl.errors import CommandTimeout, ExitCode, OpsctlError, ProvisionError, UnreachableError
from opsctl.facts.manifest import Manifest, build_local_manifest
from opsctl.inventory.model import Host, ModelSourceKind, Router
from opsctl.kernel import audit
from opsctl.kernel.locks import lock_for, router_lock
from opsctl.ops.base import Artifacts, Context, Operation, Options, Plan
from opsctl.ops.cuda_toolkit import CudaToolkit
from opsctl.ops.gpu_driver import GpuDriver
from opsctl.ops.model_restore import ModelRestore
from opsctl.ops.model_sync import ModelSync, models_of
from opsctl.ops.python_venv import PythonVenv
from opsctl.ops.router_wheels import RouterWheels
from opsctl.ops.runtime_wheel import PushRuntimeWheel
from opsctl.progress import Ticker, stderr_line
from opsctl.remote.base import Connect, Connection

PLAYBOOK = bundle.playbooks_dir() / "provision.yaml"
MANIFEST_CACHE = Path("/var/cache/opsctl/manifests")

OPERATIONS: dict[str, Callable[[], Operation]] = {
    "gpu_driver": GpuDriver,
    "cuda_toolkit": CudaToolkit,
    "python_venv": PythonVenv,
    "runtime_wheel": PushRuntimeWheel,
    "router_wheels": RouterWheels,
    "model_sync": ModelSync,
    "model_restore": ModelRestore,
}


class StepStatus(StrEnum):
    UNCHANGED = "unchanged"  # already in the desired state
    CHANGED = "changed"  # commands ran and the step converged
    PENDING = "pending"  # --plan: commands would run
    REBOOT = "reboot_required"
    FAILED = "failed"
    SKIPPED = "skipped"  # an earlier step failed or needs a reboot


class HostStatus(StrEnum):
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    PENDING = "pending"
    REBOOT = "reboot_required"
    FAILED = "failed"


@dataclass(frozen=True)
class StepReport:
    op: str
    status: StepStatus
    commands: tuple[str, ...] = ()  # display forms (secrets masked): planned, or run
    notes: tuple[str, ...] = ()
    error: str | None = None
    hint: str | None = None


@dataclass(frozen=True)
class HostReport:
    host: str
    steps: tuple[StepReport, ...] = ()
    error: str | None = None  # a failure outside any step (e.g. unreachable)
    hint: str | None = None

    @property
    def status(self) -> HostStatus:
        statuses = {s.status for s in self.steps}
        if self.error is not None or StepStatus.FAILED in statuses:
            return HostStatus.FAILED
        if StepStatus.REBOOT in statuses:
            return HostStatus.REBOOT
        if StepStatus.CHANGED in statuses:
            return HostStatus.CHANGED
        if StepStatus.PENDING in statuses:
            return HostStatus.PENDING
        return HostStatus.UNCHANGED

    @property
    def changes(self) -> int:
        return sum(len(s.commands) for s in self.steps if s.status in (StepStatus.CHANGED, StepStatus.PENDING))


@dataclass(frozen=True)
class Settings:
    plan_only: bool = False
    options: Options = field(default_factory=Options)
    wheelhouse: Path | None = None  # --wheelhouse DIR: used as given for every host
    runtime_wheel: Path | None = None  # --runtime-wheel FILE: push this wheel instead of building runtime/
    forks: int = 16
    playbook: Path = PLAYBOOK
    say: Callable[[str], None] = stderr_line  # progress lines of long steps (stderr: --json stays clean)


@dataclass(frozen=True)
class Result:
    plan: bool
    hosts: tuple[HostReport, ...] = field(default=())

    @property
    def exit_code(self) -> ExitCode:
        statuses = {h.status for h in self.hosts}
        if HostStatus.FAILED in statuses:
            return ExitCode.ERROR
        if HostStatus.REBOOT in statuses:
            return ExitCode.REBOOT_REQUIRED
        if self.plan and HostStatus.PENDING in statuses:
            return ExitCode.CHANGES_PENDING
        return ExitCode.OK


def load_playbook(path: Path) -> tuple[str, ...]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ProvisionError(f"cannot read playbook {path}: {exc}") from None
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise ProvisionError(f"{path}: `steps:` must be a list of operation names")
    unknown = [s for s in steps if s not in OPERATIONS]
    if unknown:
        raise ProvisionError(f"{path}: unknown step {unknown[0]!r}", f"known: {', '.join(OPERATIONS)}")
    return tuple(steps)


def prepare(
    hosts: Sequence[Host], steps: Sequence[str], settings: Settings, routers: Sequence[Router] = ()
) -> Artifacts:
    """Build what every host shares, once, on the control machine (also for --plan: caches only)."""
    wheelhouses: dict[str, Path] = {}
    if "python_venv" in steps:
        for host in hosts:
            lock = lock_for(host)
            if settings.wheelhouse is not None:
                wheelhouses[lock.profile] = wheelhouse.given(settings.wheelhouse).path
            elif host.wheelhouse is not None and lock.profile not in wheelhouses:
                wheelhouses[lock.profile] = wheelhouse.ensure(lock, Path(host.wheelhouse), out=settings.say).path
    runtime = None
    if "runtime_wheel" in steps:
        with Ticker("runtime wheel", out=settings.say):  # a build from source takes seconds, once per source
            runtime = artifact.runtime_wheel(settings.runtime_wheel)
    manifests: dict[str, Manifest] = {}
    if "model_sync" in steps:
        for host in hosts:
            for spec in models_of(host):
                if spec.source_on is ModelSourceKind.CONTROL and spec.source not in manifests:
                    manifests[spec.source] = control_manifest(Path(spec.source))
    router_wheelhouses: dict[str, Path] = {}
    if "router_wheels" in steps:
        by_name = {h.name: h for h in hosts}
        for router in routers:
            runs = by_name.get(router.host)
            if runs is not None and runs.wheelhouse is not None:
                router_wheelhouses[runs.name] = router_wheelhouse(router, Path(runs.wheelhouse))
    return Artifacts(
        wheelhouses=wheelhouses, runtime_wheel=runtime, manifests=manifests, router_wheelhouses=router_wheelhouses
    )


def accepted_models(hosts: Sequence[Host], given: Sequence[str]) -> frozenset[str]:
    """`--accept-model` values, each a model destination of a selected host (a typo must not pass silently)."""
    known = {spec.path.rstrip("/") for host in hosts for spec in models_of(host)}
    wanted = frozenset(p.rstrip("/") for p in given)
    unknown = sorted(wanted - known)
    if unknown:
        raise ProvisionError(
            f"--accept-model {unknown[0]}: no selected host's service uses a model at that path",
            f"models of the selected hosts: {', '.join(sorted(known)) or 'none'}",
        )
    return wanted


def router_wheelhouse(router: Router, host_wheelhouse: Path) -> Path:
    """The router's offline wheels, next to the host's wheelhouse: `<wheelhouse>-sglang-router-<version>`."""
    lock = router_lock(router.version)
    directory = host_wheelhouse.with_name(f"{host_wheelhouse.name}-{lock.name.removesuffix('.txt')}")
    return wheelhouse.ensure(lock, directory).path


def control_manifest(source: Path) -> Manifest:
    if not source.is_dir():
        raise ProvisionError(f"model source {source} is not a directory on the control machine", "fix models.source")
    key = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:16]
    cache = MANIFEST_CACHE / f"{key}.json"
    try:
        return build_local_manifest(source, cache)
    except PermissionError:
        return build_local_manifest(source, None)


def provision_host(
    spec: Host,
    remote: Connection,
    steps: Sequence[str],
    settings: Settings,
    artifacts: Artifacts,
    progress: Callable[[str, StepReport], None] | None = None,
) -> HostReport:
    ctx = Context(spec, remote, settings.options, artifacts)
    reports: list[StepReport] = []
    stop: StepStatus | None = None
    for name in steps:
        if stop is not None:
            reports.append(StepReport(name, StepStatus.SKIPPED))
            continue
        with Ticker(f"{spec.name}: {name}", out=settings.say) as ticker:
            report = run_step(OPERATIONS[name](), replace(ctx, progress=ticker.update), settings.plan_only)
        reports.append(report)
        if progress is not None:
            progress(spec.name, report)
        if report.status is StepStatus.FAILED or (report.status is StepStatus.REBOOT and not settings.plan_only):
            stop = report.status
    return HostReport(spec.name, tuple(reports))


def run_step(op: Operation, ctx: Context, plan_only: bool) -> StepReport:
    plan: Plan | None = None
    try:
        plan = op.plan(ctx)
        if plan_only:
            status = (
                StepStatus.REBOOT
                if plan.reboot_required
                else (StepStatus.PENDING if plan.changes else StepStatus.UNCHANGED)
            )
            return StepReport(op.name, status, tuple(plan.commands()), plan.notes)
        if not plan.changes and not plan.reboot_required:
            return StepReport(op.name, StepStatus.UNCHANGED, (), plan.notes)
        after = op.apply(ctx, plan)
        status = (
            StepStatus.REBOOT
            if after.reboot_required
            else (StepStatus.CHANGED if plan.changes else StepStatus.UNCHANGED)
        )
        notes = (*plan.notes, *(n for n in after.notes if n not in plan.notes))  # what apply learnt, once
        return StepReport(op.name, status, tuple(plan.commands()), notes)
    except OpsctlError as exc:
        commands = tuple(plan.commands()) if plan is not None else ()
        notes = plan.notes if plan is not None else ()
        if not plan_only:
            _audit_failure(ctx, op.name, exc, refused=plan is None)
        return StepReport(op.name, StepStatus.FAILED, commands, notes, exc.message, exc.hint)


def _audit_failure(ctx: Context, step: str, exc: OpsctlError, refused: bool) -> None:
    """A step that refused (its facts said no: a model source that is not the accepted one, no room in /dev/shm)
    or failed while it changed the host is an act on the host too: one audit line, through the one writer. Not
    under --plan, which writes nothing; an unreachable host gets the control machine's line only."""
    reachable = not isinstance(exc, UnreachableError | CommandTimeout)
    detail = f"{step}: {exc.one_line()}"
    audit.record(ctx.spec, "-", "provision", None, "refused" if refused else "failed", detail,
                 conn=ctx.remote if reachable else None)  # fmt: skip


def provision(
    hosts: Sequence[Host],
    settings: Settings,
    connect: Connect | None = None,
    progress: Callable[[str, StepReport], None] | None = None,
    routers: Sequence[Router] = (),
) -> Result:
    from opsctl.remote import connect as ssh_connect
    from opsctl.remote import run_parallel

    steps = load_playbook(settings.playbook)
    artifacts = prepare(hosts, steps, settings, routers)
    opener: Connect = connect or ssh_connect

    def one(spec: Host) -> HostReport:
        remote = opener(spec)
        try:
            return provision_host(spec, remote, steps, settings, artifacts, progress)
        finally:
            remote.close()

    outcomes = run_parallel(list(hosts), key=lambda h: h.name, fn=one, forks=settings.forks)
    reports = [
        o.value if o.value is not None else HostReport(o.host, error=o.error.message if o.error else "?",
                                                       hint=o.error.hint if o.error else None)
        for o in outcomes
    ]  # fmt: skip
    return Result(settings.plan_only, tuple(reports))
