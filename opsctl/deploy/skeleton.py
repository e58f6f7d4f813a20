"""The deploy of one target (a service or a router) on its connected host, written once: read the releases, render
and hash, judge an unchanged config (gates never finished, drift, the unchanged audit line, a unit still starting
or stopped), print the plan, refuse before any change, mark incomplete releases BAD, check free space, stage,
mark the release pending, go live, gate, clear pending, prune; or roll back, with every audit line on the way.

A `DeployTarget` supplies only what differs between targets: its render and hash, extra reasons to redeploy an
unchanged config, the checks made before anything changes, the files it stages, its gates, its plan lines, the
hint for an unchanged release that does not serve, and its noun. A check that every target gets goes in
`deploy()` below; one for a single kind of target goes in that target's hooks. The caller holds the host's
deploy lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from opsctl.deploy import corridor, drift, guards, pending, release
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.release import ReleaseFacts
from opsctl.errors import CommandTimeout, OpsctlError, UnreachableError, without_prefixes
from opsctl.health import HealthProbe
from opsctl.kernel.gate import Interrupted
from opsctl.remote.base import Connection

NOT_SWITCHED = "interrupted before the switch"  # a reason that needs no rollback: nothing live changed


@dataclass(frozen=True)
class Reason:
    """Why an unchanged config is deployed again: `why` ends the deploy-start audit line and the plan's message,
    `said` is the progress line."""

    why: str
    said: str


class Settings(Protocol):
    """What the walk reads of a deploy's settings (a service's `DeploySettings` has more)."""

    @property
    def force(self) -> bool: ...

    @property
    def plan(self) -> bool: ...

    @property
    def keep(self) -> int: ...


@dataclass(frozen=True)
class Options:
    """`Settings` for a target that has no others (a router)."""

    force: bool = False  # deploy even when the config hash equals current's
    plan: bool = False  # print what would change, change nothing
    keep: int = release.DEFAULT_KEEP  # releases kept (current never pruned)


class Result(Protocol):
    """What the walk fills of a target's result (the service's and the router's have these fields)."""

    outcome: Outcome
    release: str | None
    previous: str | None
    message: str
    journal_tail: str
    plan: list[str]
    timings: dict[str, float]


R = TypeVar("R", bound=Result)


class DeployTarget(pending.Gated, Protocol):
    """A service or a router, as the walk deploys it (its release corridor plus what differs)."""

    @property
    def conn(self) -> Connection: ...

    @property
    def host_name(self) -> str: ...

    @property
    def start_note(self) -> str:
        """Appended to the deploy-start audit line after `previous=` (a service: its mode)."""
        ...

    def read_facts(self) -> ReleaseFacts: ...

    def render(self, facts: ReleaseFacts) -> tuple[str, str]:
        """Render the release once; (its new id, its config hash)."""
        ...

    def refuse_first(self) -> None:
        """Refusals made before even an unchanged config is judged (a service: a damaged model)."""
        ...

    def redeploy_reasons(self, facts: ReleaseFacts, plan: bool) -> list[Reason]:
        """Reasons to deploy an unchanged config again, asked only when the hash is current's."""
        ...

    def probe(self) -> HealthProbe: ...

    def start_again(self, current: str) -> tuple[bool, str] | None:
        """An unchanged release that does not serve and is not starting: start it again (healthy, a note), or None
        where the target does not (it audits its own line)."""
        ...

    def unhealthy_hint(self, current: str) -> str:
        """What to do about an unchanged release that does not serve."""
        ...

    def planned(self, facts: ReleaseFacts, new_id: str, why: str, result: Result) -> None:
        """--plan: fill `result.plan` and `result.message` (or fail it: a pre-flight that would refuse)."""
        ...

    def refuse_before_change(self) -> None:
        """Refusals made after the plan and before anything changes (a service: models not on the host)."""
        ...

    def check_cancel(self) -> None: ...

    def stage(self, new_id: str, facts: ReleaseFacts, config_hash: str) -> None:
        """Write the release dir and its manifest last (a release with a manifest is complete); nothing live
        changes. Raises on failure."""
        ...

    def live_gate(self, baseline: int, result: Result) -> str:
        """The gates of the release just restarted (fills `result.timings`); the failure reason, or "". Raises
        Interrupted when cancelled."""
        ...

    def audit_local(self, action: str, release_id: str | None, result: str, detail: str = "") -> None:
        """The control machine's audit line only (the host is unreachable)."""
        ...


def deploy(target: DeployTarget, settings: Settings, result: R) -> R:
    """facts -> render -> unchanged? -> plan? -> refuse -> stage -> go live -> prune | roll back; fills `result`."""
    start = time.monotonic()
    facts = target.read_facts()
    result.previous = facts.current
    new_id, chash = target.render(facts)
    target.refuse_first()
    same_config = facts.current is not None and facts.current_hash == chash and not settings.force
    reasons = target.redeploy_reasons(facts, settings.plan) if same_config else []
    same = same_config and not reasons
    if same and facts.current_pending:
        return pending.finish_gates(target, facts, result, settings.plan)
    current = str(facts.current)
    # Files of the current release changed on the host (edited by hand): a new release writes them again
    changed = drift.release_drift(target.conn, target.paths, [current], facts.current).get(current, []) if same else []
    retired = _retire_drifted_targets(target, facts) if same and not settings.plan else []
    if same and not changed:
        _unchanged(target, settings.plan, current, result)
        result.message += "".join(f"; drifted rollback target {r} marked bad" for r in retired)
        return result
    why = "".join(r.why for r in reasons)
    why += f"; drift: {changed[0]}" + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "") if changed else ""
    if settings.plan:
        result.outcome, result.release = Outcome.PLANNED, new_id
        target.planned(facts, new_id, why, result)
        return result
    target.refuse_before_change()
    for reason in reasons:
        target.say(reason.said)
    for line in changed:
        target.say(f"drift: {line}: deploying a new release to repair it")
    abandoned = guards.mark_incomplete(target, facts)
    if abandoned:
        target.say(f"marked incomplete release {', '.join(abandoned)} BAD (its staging never finished)")
    guards.check_free_space(target.conn, target.host_name, target.paths)
    result.release = new_id
    target.audit("deploy-start", new_id, "started", f"previous={facts.current or '-'}{target.start_note}{why}")
    if _stage(target, new_id, facts, chash, result) and _before_live(target, new_id, result):
        _go_live(target, settings.keep, new_id, facts.current, result)
        if changed and result.outcome is Outcome.DEPLOYED:
            # its files are not what was deployed: no rollback target (status would name it one, and fail)
            target.mark_bad(current, f"drift: files edited on the host; replaced by {new_id}")
            target.say(f"marked {current} BAD: its files were edited on the host ({new_id} replaces it)")
            result.message += f"; drifted {current} marked bad"
        result.timings["total_s"] = time.monotonic() - start
    return result


def _unchanged(target: DeployTarget, plan: bool, current: str, result: Result) -> None:
    """Same config as current: nothing restarts, but a target that does not serve is a failure, not success. A unit
    still starting gets the gate's time; a stopped one may be started again (the target's choice)."""
    result.outcome, result.release = Outcome.UNCHANGED, current
    result.message = f"release {current}: same config, nothing restarted"
    probe = target.probe()
    ok, note, audited = probe.ok, "", False
    if not ok and not plan:
        ok, note = corridor.came_up(target)
        again = None if ok else target.start_again(current)
        if again is not None:
            (ok, note), audited = again, True
            if ok:
                result.message = f"release {current}: same config"
        if ok:
            result.message += note
    if not ok:
        result.outcome = Outcome.FAILED
        hint = target.unhealthy_hint(current)
        result.message = f"unchanged config (release {current}) but /health: {probe.describe()}{note}; {hint}"
    if not plan and not audited:
        target.audit("deploy", current, "unchanged" if ok else "unchanged-unhealthy")


def _retire_drifted_targets(target: DeployTarget, facts: ReleaseFacts) -> list[str]:
    """A rollback target whose files changed on the host since its deploy is no target: `rollback` would restore
    files nobody deployed, and `status` fails on it. Each is marked BAD (the release before it becomes the target,
    and is checked the same way, at most 5 in a row); their files cannot be written again (they were rendered from
    the inventory of their day). Returns the ids marked."""
    retired: list[str] = []
    for _ in range(5):
        older = facts.rollback_target()
        if older is None or older == facts.current:
            break
        lines = drift.release_drift(target.conn, target.paths, [older], facts.current).get(older, [])
        if not lines:
            break
        target.mark_bad(older, f"drift: {lines[0]}")
        target.say(f"rollback target {older} drifted ({lines[0]}): marked BAD, so it is no rollback target")
        retired.append(older)
        marked = tuple(replace(r, bad=True) if r.release_id == older else r for r in facts.releases)
        facts = replace(facts, releases=marked)
    return retired


def _stage(target: DeployTarget, new_id: str, facts: ReleaseFacts, chash: str, result: Result) -> bool:
    """Stage; on failure fill `result` (nothing was switched) and return False."""
    start = time.monotonic()
    target.say(f"staging {new_id}")
    try:
        target.check_cancel()
        target.stage(new_id, facts, chash)
        result.timings["stage_s"] = time.monotonic() - start
        return True
    except Interrupted:
        target.mark_bad(new_id, "interrupted while staging")
        result.outcome, result.message = Outcome.INTERRUPTED, "interrupted while staging: nothing switched"
        target.audit("deploy", new_id, "interrupted", "while staging")
    except UnreachableError as exc:
        # The release stays incomplete on the host; the next deploy there marks it BAD (guards.mark_incomplete).
        result.outcome, result.message = Outcome.UNREACHABLE, f"{exc.one_line()} (while staging {new_id})"
        target.audit_local("deploy", new_id, "unreachable", exc.one_line())
    except OpsctlError as exc:
        result.outcome, result.message = Outcome.FAILED, corridor.staging_failed(target, new_id, exc)
    return False


def _before_live(target: DeployTarget, new_id: str, result: Result) -> bool:
    """The target's hook right before the switch (a service: out of its routers); False: failed, nothing switched."""
    try:
        target.before_live()
    except OpsctlError as exc:
        target.mark_bad(new_id, f"not switched: {exc.message}")
        result.outcome, result.message = Outcome.FAILED, f"nothing switched: {exc.one_line()}"
        target.audit("deploy", new_id, "failed", result.message)
        return False
    return True


def _switch_and_gate(target: DeployTarget, new_id: str, result: Result) -> str:
    """Mark pending, switch, restart, gate; the failure reason, or "" when live. Unreachable raises."""
    try:
        target.check_cancel()
    except Interrupted:
        return NOT_SWITCHED
    try:
        target.say(f"switching to {new_id} and restarting {target.paths.unit_name}")
        target.run(release.mark_pending_cmd(target.paths, new_id))  # untested until its gates pass
        t_restart = time.monotonic()
        baseline = target.restart(new_id)
        result.timings["restart_s"] = time.monotonic() - t_restart
        target.say(f"restarted in {result.timings['restart_s']:.1f}s; health gate")
        return target.live_gate(baseline, result)
    except Interrupted:
        return "interrupted"
    except (UnreachableError, CommandTimeout):
        raise
    except OpsctlError as exc:
        return exc.one_line()


def _go_live(target: DeployTarget, keep: int, new_id: str, previous: str | None, result: Result) -> None:
    """Switch and gate; then prune (deployed), or roll back to `previous` (failed), filling `result`."""
    try:
        reason = _switch_and_gate(target, new_id, result)
    except (UnreachableError, CommandTimeout) as exc:
        said = without_prefixes(exc.one_line(), target.host_name, "unreachable")
        result.outcome, result.message = Outcome.UNREACHABLE, f"host became unreachable mid-deploy: {said}"
        target.audit_local("deploy", new_id, "unreachable", exc.one_line())
        return
    if reason == NOT_SWITCHED:
        target.mark_bad(new_id, NOT_SWITCHED)
        result.outcome, result.message = Outcome.INTERRUPTED, f"{NOT_SWITCHED}: nothing switched"
        target.audit("deploy", new_id, "interrupted", NOT_SWITCHED)
        return
    if not reason:
        target.run(release.clear_pending_cmd(target.paths, new_id), check=False)
        pruned = _prune(target, keep)
        result.outcome = Outcome.DEPLOYED
        result.message = f"{new_id} (previous: {previous or 'none'})" + (
            f"; pruned {len(pruned)} old releases" if pruned else ""
        )
        target.audit("deploy", new_id, "ok", f"previous={previous or '-'}")
        return
    result.journal_tail = target.journal_tail()
    result.outcome, result.message = corridor.roll_back_after_failure(target, previous, new_id, reason)


def _prune(target: DeployTarget, keep: int) -> list[str]:
    try:
        doomed = release.plan_prune(target.read_facts(), keep)
        if doomed:
            target.run(release.remove_releases_cmd(target.paths, doomed))
        return doomed
    except OpsctlError:
        return []
