"""The release corridor shared by services and routers: the commands that put a release live, that restore
an older one after a failure, and that take away a first release that failed, as values; and the choreography
around them (roll back after a failure, `rollback`), written once for both (`Releasable`).

`--plan` prints these exact steps and the deploys run them (`run_steps`), so the service's and the router's
sides cannot drift apart again (the router's used to restore without `reset-failed`). Pure but `run_steps`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from opsctl import systemd
from opsctl.commands import Cmd
from opsctl.deploy import guards, release
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.release import ServicePaths
from opsctl.errors import CommandTimeout, OpsctlError, UnreachableError


@dataclass(frozen=True)
class Step:
    cmd: Cmd
    check: bool = True  # False: its failure does not stop the corridor (enable, the cleanup of a teardown)

    def display(self) -> str:
        return self.cmd.display() + ("" if self.check else "  (may fail)")


def go_live(paths: ServicePaths, release_id: str) -> tuple[Step, ...]:
    """Switch `current` atomically, install the release's unit, reload, enable, restart."""
    return (
        Step(release.switch_cmd(paths, release_id)),
        Step(release.install_unit_cmd(paths, release_id)),
        Step(systemd.daemon_reload_cmd()),
        Step(systemd.enable_cmd(paths.unit_name), check=False),
        Step(systemd.restart_cmd(paths.unit_name)),
    )


def restore(paths: ServicePaths, release_id: str) -> tuple[Step, ...]:
    """Back to a release that served before: the failed one's crash loop is forgotten first (NRestarts and a
    `failed` state would otherwise fail the restored release's gate, and StartLimitBurst could refuse it)."""
    return (Step(systemd.reset_failed_cmd(paths.unit_name), check=False), *go_live(paths, release_id))


def teardown(paths: ServicePaths) -> tuple[Step, ...]:
    """A first release failed with nothing to go back to: stop the unit, remove what the deploy installed."""
    return (
        Step(systemd.disable_now_cmd(paths.unit_name), check=False),
        Step(Cmd.of("rm", "-f", "--", paths.current, paths.installed_unit, sudo=True), check=False),
        Step(systemd.daemon_reload_cmd(), check=False),
        Step(systemd.reset_failed_cmd(paths.unit_name), check=False),
    )


def run_steps(run: Callable[[Cmd, bool], object], steps: Sequence[Step]) -> None:
    """Each step in order through `run(cmd, check)`; a checked step that fails raises (the caller's error)."""
    for step in steps:
        run(step.cmd, step.check)


def plan_lines(steps: Sequence[Step]) -> list[str]:
    return ["  $ " + step.display() for step in steps]


# ---------------------------------------------------------------- the choreography, for both targets


class Releasable(Protocol):
    """A service's or a router's releases on its connected host, as the corridor drives them."""

    @property
    def paths(self) -> ServicePaths: ...

    @property
    def noun(self) -> str:
        """What its messages call it: "service" or "router"."""
        ...

    def say(self, line: str) -> None: ...

    def restart(self, release_id: str, restoring: bool = False) -> int:
        """The go-live (or restore) steps; NRestarts right after the restart."""
        ...

    def gate(self, baseline: int, restoring: bool = False) -> tuple[bool, str, float]:
        """(healthy, reason, seconds to healthy). A restoring gate re-checks a release that served before: a short
        readiness delay, and Ctrl-C does not stop it."""
        ...

    def unit_state(self) -> systemd.UnitState: ...

    def run(self, cmd: Cmd, check: bool = True) -> str: ...

    def mark_bad(self, release_id: str, why: str) -> None: ...

    def teardown(self) -> None:
        """A first release failed with nothing to go back to: stop the unit, remove what the deploy installed."""
        ...

    def journal_tail(self) -> str: ...

    def audit(self, action: str, release_id: str | None, result: str, detail: str = "") -> None: ...


def roll_back_after_failure(target: Releasable, previous: str | None, failed: str, reason: str) -> tuple[Outcome, str]:
    """`failed` went live and failed (`reason`): mark it bad and bring `previous` back, health gated (or, with no
    previous release, tear down). A host that stops answering is UNREACHABLE, not a failed rollback."""
    interrupted = reason == "interrupted"
    target.say(f"FAILED: {reason}")
    try:
        target.mark_bad(failed, reason)
        if previous is None:
            target.teardown()
            target.audit("deploy", failed, "failed", f"{reason}; no previous release: {target.noun} stopped")
            outcome = Outcome.INTERRUPTED if interrupted else Outcome.FAILED
            return outcome, f"{reason}; no previous release to roll back to: {target.noun} stopped"
        target.say(f"rolling back to {previous}")
        ok, why, _ = target.gate(target.restart(previous, restoring=True), restoring=True)
    except (UnreachableError, CommandTimeout) as exc:
        return Outcome.UNREACHABLE, f"{reason}; rollback impossible: {exc.one_line()}"
    except OpsctlError as exc:
        target.audit("rollback-auto", previous, "failed", f"{reason}; {exc.one_line()}")
        return Outcome.FAILED, f"{reason}; rollback to {previous} failed: {exc.one_line()}"
    if not ok:
        target.audit("rollback-auto", previous, "failed", f"{reason}; previous unhealthy: {why}")
        return Outcome.FAILED, f"{reason}; rolled back to {previous} but it is not healthy: {why}"
    target.audit("rollback-auto", previous, "ok", reason)
    if interrupted:
        target.audit("deploy", failed, "interrupted", f"after the switch; {previous} restored")
        return Outcome.INTERRUPTED, f"interrupted: {previous} restored and healthy; {failed} marked bad"
    return Outcome.ROLLED_BACK, f"{reason}; rolled back to {previous} (healthy); {failed} marked bad"


def roll_back_to(target: Releasable, current: str | None, to: str) -> tuple[Outcome, str, str]:
    """`rollback`: put `to` live, health gated; if it fails its gate, mark it bad and restore `current`.
    (outcome, message, the unit's journal tail when it failed)."""
    target.say(f"rolling back {current} -> {to}")
    ok, why, _ = target.gate(target.restart(to))
    if ok:
        target.audit("rollback", to, "ok", f"from={current or '-'}")
        return Outcome.REVERTED, f"rolled back to {to} (healthy)", ""
    tail = target.journal_tail()
    if current:
        target.mark_bad(to, f"rollback target unhealthy: {why}")
        target.gate(target.restart(current, restoring=True), restoring=True)
    target.audit("rollback", to, "failed", why)
    return Outcome.FAILED, f"{to} failed its health gate ({why}); {current} restored", tail


def came_up(target: Releasable) -> tuple[bool, str]:
    """An unchanged release whose /health does not answer: a unit still starting (right after a reboot, say) gets
    the health gate's time before it is judged. (healthy, a note for the message)."""
    unit = target.unit_state()
    if unit.active_state not in ("active", "activating"):
        return False, ""
    target.say(
        f"unchanged config; {target.paths.unit_name} is {unit.describe()} but /health does not answer yet: waiting"
    )
    ok, _, seconds = target.gate(unit.n_restarts)
    return ok, f" (was still starting; healthy after {seconds:.1f}s)" if ok else ""


def staging_failed(target: Releasable, new_id: str, exc: OpsctlError) -> str:
    """Staging `new_id` failed, nothing was switched: mark it bad (on a full disk, where not even the BAD marker can
    be written, remove the partial release instead: it only holds space), audit, and say why in one line."""
    why = guards.bounded(exc.message)
    space = guards.space_hint(exc)
    if space:
        target.run(release.remove_releases_cmd(target.paths, [new_id]), check=False)
        why += f"; the partial release {new_id} was removed"
    else:
        target.mark_bad(new_id, f"staging failed: {why}")
    hint = space or exc.hint
    message = f"staging failed, nothing switched: {why}" + (f" ({hint})" if hint else "")
    target.audit("deploy", new_id, "failed", message)
    return message
