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

from opsctl.commands import Cmd
from opsctl.errors import DeployError, ExitCode
from opsctl.health import HealthProbe

SHOW_PROPS = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts", "MainPID", "ActiveEnterTimestamp")


class Interrupted(DeployError):
    """Ctrl-C arrived while deploying; the caller restores the previous release."""

    exit_code = ExitCode.INTERRUPTED

    def __init__(self) -> None:
        super().__init__("interrupted", "the previous release was restored")


@dataclass(frozen=True)
class UnitState:
    load_state: str
    active_state: str  # active | activating | deactivating | inactive | failed | reloading
    sub_state: str  # running | auto-restart | dead | ...
    result: str  # success | exit-code | signal | start-limit-hit | ...
    n_restarts: int
    main_pid: int
    active_enter: str  # ActiveEnterTimestamp, as systemd prints it ("" when never active)

    @property
    def running(self) -> bool:
        return self.active_state == "active" and self.sub_state == "running"

    def describe(self) -> str:
        return f"{self.active_state}/{self.sub_state} (result {self.result}, NRestarts {self.n_restarts})"


def show_cmd(unit: str) -> Cmd:
    return Cmd.of("systemctl", "show", "-p", ",".join(SHOW_PROPS), "--", unit)


def parse_show(stdout: str) -> UnitState:
    """`systemctl show -p ...` output (KEY=VALUE lines)."""
    values = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    if "ActiveState" not in values:
        raise DeployError(f"unexpected `systemctl show` output: {stdout.strip()[:200]!r}")

    def _int(key: str) -> int:
        try:
            return int(values.get(key, "0") or 0)
        except ValueError:
            return 0

    return UnitState(
        load_state=values.get("LoadState", ""),
        active_state=values["ActiveState"],
        sub_state=values.get("SubState", ""),
        result=values.get("Result", ""),
        n_restarts=_int("NRestarts"),
        main_pid=_int("MainPID"),
        active_enter=values.get("ActiveEnterTimestamp", ""),
    )


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
