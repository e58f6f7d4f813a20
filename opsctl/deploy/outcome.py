"""How one target's deploy, rollback or plan ended: the word every result line, report and exit code reads."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    DEPLOYED = "deployed"  # new release live and gated
    UNCHANGED = "unchanged"  # same config as current: nothing restarted
    ROLLED_BACK = "rolled-back"  # failed its gates; the previous release serves again
    FAILED = "failed"  # failed and could not be rolled back (or had nothing to roll back to)
    UNREACHABLE = "unreachable"
    INTERRUPTED = "interrupted"  # Ctrl-C: previous release restored
    SKIPPED = "skipped"  # not attempted: the rollout stopped (max-fail) or was interrupted
    PLANNED = "planned"  # --plan: would change
    LOCKED = "locked"  # another deploy holds the host's lock
    REVERTED = "reverted"  # `opsctl rollback`: the older release is live and healthy

    @property
    def failed(self) -> bool:
        return self in (Outcome.ROLLED_BACK, Outcome.FAILED, Outcome.UNREACHABLE, Outcome.LOCKED)
