"""One service on one connected host: deploy (stage, verify, switch, restart, gate, roll back) and rollback.

Order of a deploy: render -> stage the release dir -> `systemd-analyze verify` (no output allowed) -> switch
`current` atomically -> install the unit -> daemon-reload -> restart -> health gate -> smoke gate. Any failure
after the switch: print the unit's journal tail, switch back to the previous release, restart it, confirm it
is healthy, mark the failed release bad. The caller holds the host's deploy lock. The walk itself is
`skeleton.deploy` (shared with routers); `ServiceDeploy` is the service's side of it.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field, replace

from opsctl import __version__, artifact, health, logs, systemd
from opsctl.commands import Cmd
from opsctl.deploy import argcheck, corridor, drift, guards, preflight, release, secret_fp, skeleton
from opsctl.deploy.context import LIVE_TIMEOUT_S, ServiceContext
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.release import Manifest, ReleaseFacts, ServicePaths
from opsctl.deploy.staged import StagedRelease
from opsctl.errors import DeployError, OpsctlError
from opsctl.facts import modelcheck
from opsctl.inventory.model import Engine
from opsctl.kernel.gate import GateConfig, GateResult, health_gate
from opsctl.progress import Ticker
from opsctl.remote.base import Connection
from opsctl.render import SERVER_MODULE
from opsctl.secrets import SecretError
from opsctl.smoke import smoke_service
from opsctl.wheel import RuntimeWheel

JOURNAL_TAIL_LINES = 30


@dataclass(frozen=True)
class DeploySettings:
    keep: int = release.DEFAULT_KEEP  # releases kept per service (current never pruned)
    allow_old_secrets: bool = False  # rollback: allow a target deployed with other secrets than the current
    force: bool = False  # deploy even when the config hash equals current's; rollback --to even a BAD release
    plan: bool = False  # print what would change, change nothing
    smoke: bool = True  # run the smoke gate after the health gate
    health_timeout: float | None = None  # override the service's health_timeout
    readiness_delay: float | None = None  # override the service's readiness_delay
    poll_s: float = 1.0


@dataclass
class ServiceResult:
    host: str
    service: str
    outcome: Outcome
    release: str | None = None  # the release this run created (or targeted, for rollback)
    previous: str | None = None  # the release that was current before
    message: str = ""
    journal_tail: str = ""
    plan: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # stage_s, restart_s, healthy_s, smoke_s, total_s


def read_facts(ctx: ServiceContext) -> ReleaseFacts:
    return release.parse_release_facts(ctx.run(release.facts_cmd(ctx.paths)))


def render_release(ctx: ServiceContext, wheel: RuntimeWheel, facts: ReleaseFacts) -> tuple[StagedRelease, str]:
    """The service rendered once, bound to its new id; and its config hash (files, argv, wheel, models)."""
    staged = StagedRelease.render(ctx.host, ctx.service)
    models = [m.path for m in (ctx.service.model, ctx.service.draft_model) if m is not None]
    digests = release.parse_model_manifests(ctx.run(release.model_manifests_cmd(models), check=False), models)
    chash = staged.config_hash(wheel.sha256, digests)
    new_id = release.unused_release_id(ctx.now, chash, {r.release_id for r in facts.releases})
    return staged.bind(new_id), chash


def _preflight(ctx: ServiceContext, staged: StagedRelease, site: str | None = None) -> None:
    """The host's own server must know every flag this release passes and accept every value (before anything
    live changes). `site`: the runtime to check with (default: the release's own; --plan: current's)."""
    module = SERVER_MODULE[ctx.service.engine]
    site = site or ctx.paths.site(staged.release_id)
    out = ctx.conn.run(
        preflight.help_cmd(ctx.host.venv, module, site),
        check=False,
        timeout=preflight.HELP_TIMEOUT_S,
    )
    if not preflight.looks_like_help(out.stdout):
        last = (out.stdout.strip().splitlines() or [f"exit {out.exit_code}"])[-1]
        raise DeployError(
            f"`python -m {module} --help` fails on the host: {last}",
            "check the host's venv (`opsctl provision --plan`) and the runtime wheel",
        )
    unknown = preflight.unknown_flags(staged.server_args, out.stdout)
    if unknown:
        raise DeployError(
            f"the server on the host does not know {', '.join(unknown)} (from its own --help)",
            "fix the service's extra_args / settings in the inventory; nothing was switched",
        )
    flags = (*staged.flags, *ctx.service.extra_args)  # what the server gets: server.yaml's flags + extra_args
    models = [m.path for m in (ctx.service.model, ctx.service.draft_model) if m is not None]
    values = argcheck.values_cmd(ctx.host.venv, ctx.service.engine, site, flags, managed=models)
    checked = ctx.conn.run(values, check=False, timeout=argcheck.TIMEOUT_S)
    refused = argcheck.refusal(checked.exit_code, checked.stdout, checked.stderr)
    if refused:
        raise DeployError(
            f"the server on the host refuses this release's flag values: {refused}",
            "fix the service's settings / extra_args in the inventory; nothing was switched",
        )


def _gate(
    ctx: ServiceContext, settings: DeploySettings, baseline_restarts: int, cancellable: bool = True
) -> GateResult:
    """Health gate of the service. Restoring gates are not cancellable: Ctrl-C must not stop a rollback."""
    svc = ctx.service
    config = GateConfig(
        timeout=settings.health_timeout if settings.health_timeout is not None else svc.health_timeout,
        readiness_delay=settings.readiness_delay if settings.readiness_delay is not None else svc.readiness_delay,
        poll_s=settings.poll_s,
    )
    url = health.health_url(ctx.host, svc)
    with Ticker("waiting for /health", out=ctx.say, limit=config.timeout) as ticker:

        def probe() -> health.HealthProbe:
            answer = health.probe(ctx.http, url, timeout=5.0)
            ticker.update(f"last answer {answer.describe()}")
            return answer

        return health_gate(
            read_unit=lambda: ctx.unit_state(),
            probe=probe,
            baseline_restarts=baseline_restarts,
            config=config,
            sleep=time.sleep,
            cancelled=ctx.cancel.is_set if cancellable else (lambda: False),
        )


def _restart(ctx: ServiceContext, release_id: str, restoring: bool = False) -> int:
    """The corridor's go-live (or, `restoring`, its restore) steps; returns NRestarts right after the restart."""
    steps = corridor.restore(ctx.paths, release_id) if restoring else corridor.go_live(ctx.paths, release_id)
    corridor.run_steps(lambda cmd, check: ctx.run(cmd, check=check, timeout=LIVE_TIMEOUT_S), steps)
    return ctx.unit_state().n_restarts


def journal_tail(ctx: ServiceContext, lines: int = JOURNAL_TAIL_LINES) -> str:
    """The unit's last lines that say something: the health gate's own /health probes are dropped."""
    try:
        text = ctx.run(systemd.journal_tail_cmd(ctx.paths.unit_name, lines * 20), check=False, timeout=30)
    except OpsctlError:
        return ""
    return "\n".join(logs.without_health_probes(text.splitlines())[-lines:]).rstrip()


def _stop_and_remove(ctx: ServiceContext) -> None:
    """First deploy failed with nothing to go back to: stop the unit and remove what this deploy installed."""
    corridor.run_steps(lambda cmd, check: ctx.run(cmd, check=check), corridor.teardown(ctx.paths))


@dataclass
class ServiceRelease:
    """The service's side of the release corridor (`corridor.Releasable`)."""

    ctx: ServiceContext
    settings: DeploySettings
    noun: str = "service"
    gates: str = "health, smoke"

    @property
    def paths(self) -> ServicePaths:
        return self.ctx.paths

    def say(self, line: str) -> None:
        self.ctx.say(line)

    def restart(self, release_id: str, restoring: bool = False) -> int:
        return _restart(self.ctx, release_id, restoring=restoring)

    def gate(self, baseline: int, restoring: bool = False) -> tuple[bool, str, float]:
        settings = self.settings
        if restoring:  # this release served before: the point is to confirm it answers again
            delay = settings.readiness_delay
            settings = replace(
                settings, readiness_delay=min(self.ctx.service.readiness_delay if delay is None else delay, 5.0)
            )
        gate = _gate(self.ctx, settings, baseline, cancellable=not restoring)
        if gate.ok and settings.smoke:  # a release goes back into service only after the same gates as a deploy
            failed = _smoke(self.ctx, {})
            if failed:
                return False, failed, gate.time_to_healthy or 0.0
        return gate.ok, gate.reason, gate.time_to_healthy or 0.0

    def unit_state(self) -> systemd.UnitState:
        return self.ctx.unit_state()

    def run(self, cmd: Cmd, check: bool = True) -> str:
        return self.ctx.run(cmd, check=check, timeout=LIVE_TIMEOUT_S)

    def mark_bad(self, release_id: str, why: str) -> None:
        _mark_bad(self.ctx, release_id, why)

    def teardown(self) -> None:
        _stop_and_remove(self.ctx)

    def journal_tail(self) -> str:
        return journal_tail(self.ctx)

    def audit(self, action: str, release_id: str | None, result: str, detail: str = "") -> None:
        self.ctx.audit(action, release_id, result, detail)

    def before_live(self) -> None:
        if self.ctx.before_live is not None:
            self.ctx.before_live()  # out of its routers first (an error: nothing was switched)


def _plan(ctx: ServiceContext, facts: ReleaseFacts, staged: StagedRelease) -> list[str]:
    """Human plan lines: the release switch and a diff of each file against the current release."""
    new_id, paths = staged.release_id, ctx.paths
    lines = [f"release {facts.current or '(none)'} -> {new_id}"]
    for f in staged.files:
        if f.name == "env" or "api-key" in f.masked or "api_key" in f.masked:
            # May hold secrets: never printed, only whether it changes (compared with the id normalised).
            lines.append(f"{f.name}: (content not shown: may hold secrets)")
            continue
        old = ""
        if facts.current:
            try:
                old = ctx.conn.get_text(paths.release_file(facts.current, f.name)).replace(facts.current, new_id)
            except OpsctlError:
                old = ""
        diff = difflib.unified_diff(
            old.splitlines(), f.masked.splitlines(), f"current/{f.name}", f"new/{f.name}", lineterm=""
        )
        lines += list(diff) or [f"{f.name}: unchanged"]
    lines += [
        f"stage {paths.release(new_id)} (pip install --target site from the runtime wheel)",
        f"systemd-analyze verify {paths.release_unit(new_id)}",
        "go live:",
        *corridor.plan_lines(corridor.go_live(paths, new_id)),
        "health gate; smoke gate; on failure: "
        + (f"restore {facts.current} (reset-failed, then the same steps)" if facts.current else "teardown:"),
        *([] if facts.current else corridor.plan_lines(corridor.teardown(paths))),
        "ExecStart " + " ".join(staged.argv),
    ]
    return lines


def _secrets_rotated(ctx: ServiceContext, staged: StagedRelease, current: str, plan: bool) -> bool:
    """Whether the service's secrets differ from those the current release was deployed with."""
    try:
        secrets = staged.checked_secrets()
    except SecretError:
        if plan:
            return False  # runner.require_secrets refuses a plan (as a deploy) before any host is touched
        raise
    if not secrets:
        return False  # no secrets now; had there been some, the masked server.yaml (and the hash) changed
    try:
        stored = ctx.conn.get_text(ctx.paths.release_file(current, secret_fp.FP_FILE))
    except OpsctlError:
        stored = ""
    return secret_fp.matches(stored, secrets) is False


def deploy_service(ctx: ServiceContext, wheel: RuntimeWheel, settings: DeploySettings) -> ServiceResult:
    """The deploy walk (`skeleton.deploy`) with the service's side (`ServiceDeploy`)."""
    ctx.say("reading the host's releases and models")
    result = ServiceResult(ctx.host.name, ctx.service.name, Outcome.FAILED)
    return skeleton.deploy(ServiceDeploy(ctx, settings, wheel=wheel), settings, result)


@dataclass
class ServiceDeploy(ServiceRelease):
    """What a service's deploy adds to its release corridor (`skeleton.DeployTarget`): the staged release and
    the runtime wheel, model checks, rotated secrets, the smoke gate, the service's plan."""

    wheel: RuntimeWheel = field(kw_only=True)
    staged_release: StagedRelease | None = field(default=None, kw_only=True)
    verdicts: list[modelcheck.ModelVerdict] = field(default_factory=list, kw_only=True)

    @property
    def conn(self) -> Connection:
        return self.ctx.conn

    @property
    def host_name(self) -> str:
        return self.ctx.host.name

    @property
    def start_note(self) -> str:
        return f" mode={self.ctx.service.mode.value}"

    @property
    def staged(self) -> StagedRelease:
        if self.staged_release is None:
            raise RuntimeError("the service's release is rendered first (ServiceDeploy.render)")
        return self.staged_release

    def read_facts(self) -> ReleaseFacts:
        return read_facts(self.ctx)

    def render(self, facts: ReleaseFacts) -> tuple[str, str]:
        self.staged_release, chash = render_release(self.ctx, self.wheel, facts)
        return self.staged_release.release_id, chash

    def refuse_first(self) -> None:
        self.verdicts = guards.model_verdicts(self.ctx)
        guards.refuse_damaged(self.ctx, self.verdicts)  # a corrupt model: restarting anything only makes it an outage

    def redeploy_reasons(self, facts: ReleaseFacts, plan: bool) -> list[skeleton.Reason]:
        current = str(facts.current)
        if _secrets_rotated(self.ctx, self.staged, current, plan):
            return [skeleton.Reason("; API key changed", f"API key changed since {current}: deploying a new release")]
        # Verified model files written after the service started: restart it so it loads them.
        stale = guards.models_changed(self.verdicts)
        if stale:
            why = f"; model changed under the running service ({stale[0].detail})"
            return [skeleton.Reason(why, f"{modelcheck.describe(stale[0])}: deploying a new release to restart it")]
        return []

    def probe(self) -> health.HealthProbe:
        return health.probe(self.ctx.http, health.health_url(self.ctx.host, self.ctx.service), timeout=5.0)

    def start_again(self, current: str) -> tuple[bool, str] | None:
        return None  # a stopped service is restarted by a new release (`--force`), as its hint says

    def unhealthy_hint(self, current: str) -> str:
        ctx = self.ctx
        missing = release.missing_models(ctx.conn, ctx.service)
        if missing:
            return guards.missing_hint(ctx.host.name, missing, guards.failed_restores(ctx.conn, ctx.service, missing))
        name = f"-i INVENTORY --host {ctx.host.name} --service {ctx.service.name}"
        return f"`opsctl deploy {name} --force` restarts it (a new release), `opsctl logs {name}` shows why"

    def planned(self, facts: ReleaseFacts, new_id: str, why: str, result: skeleton.Result) -> None:
        missing = release.missing_models(self.ctx.conn, self.ctx.service)
        _planned(self.ctx, facts, self.staged, missing, why, result)

    def refuse_before_change(self) -> None:
        _refuse_missing_models(self.ctx, release.missing_models(self.ctx.conn, self.ctx.service))

    def check_cancel(self) -> None:
        self.ctx.check_cancel()

    def stage(self, new_id: str, facts: ReleaseFacts, config_hash: str) -> None:
        _write_release(self.ctx, self.staged, self.wheel, facts, config_hash)

    def live_gate(self, baseline: int, result: skeleton.Result) -> str:
        ctx = self.ctx
        gate = _gate(ctx, self.settings, baseline)
        if not gate.ok:
            return f"health gate failed: {gate.reason}"
        result.timings["healthy_s"] = gate.time_to_healthy or 0.0
        ctx.say(f"healthy after {gate.time_to_healthy:.1f}s; re-checked after the readiness delay")
        reason = ""
        if self.settings.smoke:
            ctx.check_cancel()
            reason = _smoke(ctx, result.timings)
        ctx.check_cancel()
        return reason

    def audit_local(self, action: str, release_id: str | None, result: str, detail: str = "") -> None:
        self.ctx.audit_local(action, release_id, result, detail)


def _planned(
    ctx: ServiceContext,
    facts: ReleaseFacts,
    staged: StagedRelease,
    missing: list[str],
    why: str,
    result: skeleton.Result,
) -> None:
    result.outcome, result.release = Outcome.PLANNED, staged.release_id
    result.plan = _plan(ctx, facts, staged)
    result.plan += [f"WARNING model {m} is not on the host: `opsctl provision` first" for m in missing]
    if facts.current or ctx.service.engine is not Engine.REFERENCE:
        try:  # with the current release's runtime (the new one is not staged)
            _preflight(ctx, staged, site=ctx.paths.site(facts.current) if facts.current else "/nonexistent")
            result.plan.append("pre-flight: the host's server knows every flag and accepts every value")
        except DeployError as exc:
            result.outcome = Outcome.FAILED
            result.message = f"pre-flight would refuse {staged.release_id}: {exc.one_line()}"
            return
    else:
        result.plan.append("pre-flight: at the deploy (the reference server comes with the first release)")
    result.message = f"would deploy {staged.release_id} (current: {facts.current or 'none'}{why})"


def _refuse_missing_models(ctx: ServiceContext, missing: list[str]) -> None:
    if missing:
        # After a reboot /dev/shm is empty: starting the server would only crash-loop, and so would a rollback.
        host = ctx.host.name
        raise DeployError(
            f"{host}/{ctx.service.name}: model {', '.join(missing)} not on the host (/dev/shm is emptied by a "
            "reboot); nothing was changed",
            guards.missing_hint(host, missing, guards.failed_restores(ctx.conn, ctx.service, missing)),
        )


def _write_release(
    ctx: ServiceContext, staged: StagedRelease, wheel: RuntimeWheel, facts: ReleaseFacts, chash: str
) -> None:
    """Stage the release dir: files, runtime, pre-flight, `systemd-analyze verify`, and the manifest last (a
    release with a manifest is complete). Nothing live changes."""
    paths, new_id = ctx.paths, staged.release_id
    files = staged.revealed()
    ctx.run(Cmd.of("mkdir", "-p", "--", paths.release(new_id), sudo=True))
    for f in files:
        ctx.conn.put_text(f.text, paths.release_file(new_id, f.name), f.mode)
    if facts.current:
        ctx.conn.put_text(facts.current + "\n", paths.release_file(new_id, release.PREVIOUS), 0o644)
    secrets = staged.checked_secrets()
    if secrets:
        ctx.conn.put_text(secret_fp.fingerprint(secrets), paths.release_file(new_id, secret_fp.FP_FILE), 0o600)
    artifact.ensure_on_host(ctx.conn, wheel)
    ctx.check_cancel()
    with Ticker(f"installing {wheel.name} into the release", out=ctx.say):
        ctx.run(release.pip_install_cmd(ctx.host.venv, wheel.remote_path, paths.site(new_id)), timeout=600)
    ctx.check_cancel()
    ctx.say("pre-flight: the host's server checks the release's flags")
    _preflight(ctx, staged)
    out = ctx.conn.run(systemd.verify_cmd(paths.release_unit(new_id)), check=False)
    if not out.ok or out.stdout.strip():
        raise DeployError(
            f"systemd-analyze verify rejected the unit: {out.stdout.strip()[:400] or f'exit {out.exit_code}'}",
            "fix the service's settings in the inventory (see `opsctl render`)",
        )
    ctx.check_cancel()  # an interrupt up to here changes nothing live (the release stays incomplete, then BAD)
    manifest = Manifest(
        release_id=new_id, service=ctx.service.name, host=ctx.host.name, mode=ctx.service.mode.value,
        engine=ctx.service.engine.value, config_hash=chash, created_at=ctx.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        runtime_wheel=wheel.name, runtime_sha256=wheel.sha256, runtime_version=wheel.version,
        opsctl_version=__version__, argv=staged.argv, files=staged.digests(),
    )  # fmt: skip
    ctx.conn.put_text(manifest.to_json(), f"{paths.release(new_id)}/{release.MANIFEST}", 0o644)


def _smoke(ctx: ServiceContext, timings: dict[str, float]) -> str:
    """The smoke gate; the failure reason, or "" when it passed."""
    t_smoke = time.monotonic()
    with Ticker("smoke request", out=ctx.say):
        smoke = smoke_service(
            ctx.http, ctx.host.name, ctx.service.name, health.base_url(ctx.host, ctx.service),
            health.auth_headers(ctx.service.api_key), prompt=ctx.service.smoke_prompt,
        )  # fmt: skip
    timings["smoke_s"] = time.monotonic() - t_smoke
    if not smoke.ok:
        return "smoke gate failed: " + "; ".join(smoke.reasons)
    ctx.say(f"smoke ok: {smoke.text.strip()[:60]!r}")
    return ""


def _mark_bad(ctx: ServiceContext, release_id: str, why: str) -> None:
    try:
        ctx.run(release.mark_bad_cmd(ctx.paths, release_id, why), check=False)
    except OpsctlError:
        pass


def _untested_target(ctx: ServiceContext, entry: release.ReleaseEntry, force: bool) -> bool:
    """`rollback --to` a release that never passed its gates: one that went live and was interrupted before they
    finished is warned about (the rollback runs the health and smoke gates, as a deploy does, and restores the
    current release if they fail); one marked BAD (it failed them, or was retired) needs --force. Returns whether
    the target is untested."""
    name = f"{ctx.host.name}/{ctx.service.name}"
    if entry.bad and not force:
        why = ctx.run(release.bad_reason_cmd(ctx.paths, entry.release_id), check=False).strip()
        raise DeployError(
            f"{name}: release {entry.release_id} is marked BAD ({guards.bounded(why) or 'no reason recorded'}); "
            "nothing was changed",
            "pick another release (`opsctl status`), or add --force to go back to it anyway (its gates run first)",
        )
    if entry.bad:
        ctx.say(f"WARNING {name}: {entry.release_id} is marked BAD; --force: rolling back to it, gates first")
    elif entry.pending:
        ctx.say(
            f"WARNING {name}: {entry.release_id} went live once but never finished its gates; rolling back to it "
            "runs them (health, smoke) and restores the current release if they fail"
        )
    return entry.bad or entry.pending


def rollback_service(ctx: ServiceContext, settings: DeploySettings, to: str | None = None) -> ServiceResult:
    """Back to what served before the current release (or `to`), health gated; the old current is restored if
    that fails."""
    start = time.monotonic()
    host, svc = ctx.host.name, ctx.service.name
    result = ServiceResult(host, svc, Outcome.FAILED)
    facts = read_facts(ctx)
    result.previous = facts.current
    untested = False  # `--to` a release that never passed its gates: they run now, and it is kept only if they pass
    if to is not None:
        release.ReleaseId.parse(to)
        entry = facts.entry(to)
        if entry is None or not entry.complete:
            raise DeployError(f"{host}/{svc}: no complete release {to}", f"see `opsctl status` for {svc}'s releases")
        if to == facts.current:
            raise DeployError(f"{host}/{svc}: {to} is already current", "nothing to roll back")
        untested = _untested_target(ctx, entry, settings.force)
        target = to
    else:
        found = facts.rollback_target()
        if found is None:
            raise DeployError(
                f"{host}/{svc}: nothing to roll back to (no good release older than {facts.current or 'none'})",
                "deploy a fixed configuration instead",
            )
        target = found
    result.release = target
    changed = drift.release_drift(ctx.conn, ctx.paths, [target], facts.current).get(target, [])
    for line in changed:
        ctx.say(f"rollback target drifted: {line}")
    guards.refuse_damaged(ctx, guards.model_verdicts(ctx))
    if not settings.allow_old_secrets:
        secrets = StagedRelease.render(ctx.host, ctx.service).checked_secrets()
        guards.check_rollback_secrets(ctx, target, dict(secrets))
    if settings.plan:
        result.outcome, result.message = Outcome.PLANNED, f"would roll back {facts.current} -> {target}"
        if untested:
            result.message += f" ({target} never passed its gates: they run first)"
        return result
    if ctx.before_live is not None:
        ctx.before_live()  # out of its routers first (an error: nothing was switched)
    outcome, message, tail = corridor.roll_back_to(ServiceRelease(ctx, settings), facts.current, target)
    if untested and outcome is Outcome.REVERTED:  # it passed the same gates as a deploy now
        ctx.run(release.clear_pending_cmd(ctx.paths, target), check=False)
        ctx.run(release.clear_bad_cmd(ctx.paths, target), check=False)
        message += "; it passed its gates now (no longer untested or BAD)"
    if changed:
        message += f"; its files changed on the host since its deploy ({changed[0]})"
    result.outcome, result.message, result.journal_tail = outcome, message, tail
    result.timings["total_s"] = time.monotonic() - start
    return result
