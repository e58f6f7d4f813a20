"""A release whose gates never finished (`release.PENDING_MARKER`, written at the switch, removed once the health
and smoke gates passed): the host rebooted or opsctl was killed mid-gate, and the release is `current` without
ever having been tested. The next deploy of the same configuration is not "unchanged": it runs the target's
`before_live` hook (a service: out of its routers), runs the gates on what runs now, and either keeps the release
(the marker removed) or rolls back to the last release that passed its gates, marking this one BAD. Services and
routers alike (`skeleton.deploy` calls this). `status` fails while it is so, and it is never a rollback target
(`ReleaseFacts.rollback_target`).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from opsctl.deploy import corridor, release
from opsctl.deploy.outcome import Outcome
from opsctl.deploy.release import ReleaseFacts
from opsctl.errors import OpsctlError


class _Result(Protocol):
    """What this fills of a target's result (the service's and the router's)."""

    release: str | None
    previous: str | None
    outcome: Outcome
    message: str
    journal_tail: str


class Gated(corridor.Releasable, Protocol):
    @property
    def gates(self) -> str:
        """The gates a deploy runs, for messages: "health, smoke"."""
        ...

    def before_live(self) -> None:
        """Right before a release is switched to or tested (a service: out of its routers); an error: nothing
        changed."""
        ...


R = TypeVar("R", bound=_Result)


def finish_gates(target: Gated, facts: ReleaseFacts, result: R, plan: bool) -> R:
    """The gates of `facts.current`, which went live and was never tested; fills and returns `result`."""
    current = str(facts.current)
    previous = facts.rollback_target()
    result.release, result.previous = current, previous
    if plan:
        result.outcome = Outcome.PLANNED
        result.message = (
            f"release {current} never finished its gates: run them ({target.gates}) and keep it, or roll back to "
            f"{previous or f'(nothing: stop the {target.noun})'}"
        )
        return result
    target.say(f"release {current} went live but never finished its gates: running them now")
    target.before_live()  # a service: out of its routers while it is tested (an error: nothing changed)
    try:
        ok, why, seconds = target.gate(target.unit_state().n_restarts)
    except OpsctlError as exc:
        ok, why, seconds = False, exc.one_line(), 0.0
    if ok:
        target.run(release.clear_pending_cmd(target.paths, current), check=False)
        target.audit("deploy", current, "ok", "gates finished (interrupted before)")
        result.outcome = Outcome.DEPLOYED
        result.message = f"{current}: gates finished (interrupted before), healthy after {seconds:.1f}s"
        return result
    result.journal_tail = target.journal_tail()
    result.outcome, result.message = corridor.roll_back_after_failure(
        target, previous, current, f"release {current} never finished its gates, and fails them now: {why}"
    )
    return result
