"""The health gate and the smoke gate that every deploy and rollback passes before it counts as done.

Health: the unit is active, NRestarts has not moved since the restart, /health answers 200 within the
timeout; then, after the readiness delay, all three again (a server that crashes a few seconds after its
first healthy answer is caught here, not by the first user). The gate logic takes its reads as callables,
so it is unit tested with scripted answers and a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from opsctl.errors import DeployError, ExitCode
from opsctl.health import HealthProbe
from opsctl.systemd import UnitState


class Interrupted(DeployError):
    """Ctrl-C arrived while deploying; the caller restores the previous release."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self) -> None:
        super().__init__("interrupted", "the previous release was restored")


@dataclass(frozen=True)
class GateConfig:
    timeout: float  # seconds for the first HTTP 200
    readiness_delay: float  # seconds between the first healthy answer and the re-check
    poll_s: float = 1.0


@dataclass(frozen=True)
class GateResult:
    ok: bool
    reason: str  # why it failed; "healthy" when ok
    time_to_healthy: float | None  # seconds from gate start to the first HTTP 200
    last_unit: UnitState | None
    last_probe: HealthProbe | None


def _unit_failure(unit: UnitState, baseline_restarts: int) -> str | None:
    if unit.n_restarts > baseline_restarts:
        return (
            f"the unit restarted (NRestarts {baseline_restarts} -> {unit.n_restarts}): the server crashed "
            f"({unit.describe()})"
        )
    if unit.active_state in ("failed", "inactive", "deactivating"):
        return f"the unit is {unit.describe()}"
    return None


def health_gate(
    read_unit: Callable[[], UnitState],
    probe: Callable[[], HealthProbe],
    baseline_restarts: int,
    config: GateConfig,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    cancelled: Callable[[], bool] = lambda: False,
) -> GateResult:
    """Wait for healthy, then re-check after the readiness delay. Raises Interrupted when cancelled."""
    start = clock()
    deadline = start + config.timeout
    unit: UnitState | None = None
    last: HealthProbe | None = None
    healthy_at: float | None = None
    while True:
        if cancelled():
            raise Interrupted()
        unit = read_unit()
        failure = _unit_failure(unit, baseline_restarts)
        if failure:
            return GateResult(False, failure, None, unit, last)
        if unit.active_state == "active":
            last = probe()
            if last.ok:
                healthy_at = clock()
                break
        if clock() >= deadline:
            seen = last.describe() if last else "no HTTP probe (unit not active)"
            return GateResult(
                False, f"no HTTP 200 from /health within {config.timeout:g}s (last: {seen}; unit {unit.describe()})",
                None, unit, last,
            )  # fmt: skip
        sleep(config.poll_s)
    # Second check, after the readiness delay: catches servers that die shortly after their first answer.
    until = clock() + config.readiness_delay
    while clock() < until:
        if cancelled():
            raise Interrupted()
        sleep(min(config.poll_s, max(0.0, until - clock())))
    elapsed = healthy_at - start
    for attempt in range(2):
        unit = read_unit()
        failure = _unit_failure(unit, baseline_restarts)
        if failure:
            return GateResult(False, f"second check after {config.readiness_delay:g}s: {failure}", elapsed, unit, last)
        last = probe()
        if last.ok and unit.active_state == "active":
            return GateResult(True, "healthy", elapsed, unit, last)
        if attempt == 0:
            sleep(config.poll_s)
    return GateResult(
        False, f"second check after {config.readiness_delay:g}s: /health {last.describe()}, unit {unit.describe()}",
        elapsed, unit, last,
    )  # fmt: skip


def wait_until(
    ok: Callable[[], bool],
    timeout: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    cancelled: Callable[[], bool] = lambda: False,
) -> float | None:
    """Poll `ok` until it holds: the seconds it took, or None when `timeout` passed first. Raises Interrupted
    when cancelled. A router's /readiness after its restart, a canary's membership, a drained worker."""
    start = clock()
    while True:
        if cancelled():
            raise Interrupted()
        if ok():
            return clock() - start
        if clock() - start >= timeout:
            return None
        sleep(poll_s)


def readiness_gate(
    ready: Callable[[], HealthProbe],
    upstream_up: Callable[[], bool],
    timeout: float,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """A router serves when its /readiness answers 200 (one healthy worker); not asked when none of its workers
    is up anyway (a first deploy: it serves once they come). "" when ready, else why not."""
    if not upstream_up():
        return ""
    if wait_until(lambda: ready().ok, timeout, poll_s, clock, sleep) is not None:
        return ""
    return f"/readiness not 200 within {timeout:g}s although workers answer /health: the router cannot reach them"
