"""The release corridor as exact commands (services and routers run the same ones), and the router's readiness
wait as a poller with a fake clock."""

from __future__ import annotations

from opsctl.deploy import corridor
from opsctl.deploy.release import ServicePaths
from opsctl.health import HealthProbe
from opsctl.kernel.gate import readiness_gate, wait_until

ROOT = "/opt/opsctl/services/router-front"
UNIT = "opsctl-router-front.service"


def test_go_live_restore_and_teardown_are_exact_commands() -> None:
    paths = ServicePaths("router-front")
    rid = "20261202T060000Z-0123456789ab"
    live = [s.cmd.display() for s in corridor.go_live(paths, rid)]
    assert live == [
        f"sh -c 'ln -sfn releases/{rid} {ROOT}/current.tmp && mv -T {ROOT}/current.tmp {ROOT}/current'",
        f"install -m 0644 {ROOT}/releases/{rid}/{UNIT} /etc/systemd/system/{UNIT}",
        "systemctl daemon-reload",
        f"systemctl enable --quiet -- {UNIT}",
        f"systemctl restart -- {UNIT}",
    ]
    restore = [s.cmd.display() for s in corridor.restore(paths, rid)]
    assert restore == [f"systemctl reset-failed -- {UNIT}", *live]
    assert [s.cmd.display() for s in corridor.teardown(paths)] == [
        f"systemctl disable --now --quiet -- {UNIT}",
        f"rm -f -- {ROOT}/current /etc/systemd/system/{UNIT}",
        "systemctl daemon-reload",
        f"systemctl reset-failed -- {UNIT}",
    ]
    assert [s.check for s in corridor.go_live(paths, rid)] == [True, True, True, False, True]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_wait_until_returns_the_time_taken_or_none() -> None:
    clock = Clock()
    answers = iter([False, False, True])
    assert wait_until(lambda: next(answers), 10, 0.5, clock, clock.sleep) == 1.0
    clock = Clock()
    assert wait_until(lambda: False, 3, 0.5, clock, clock.sleep) is None and clock.t == 3.0


def test_readiness_gate_waits_only_when_workers_are_up() -> None:
    clock = Clock()
    down = HealthProbe(ok=False, status_code=503, error=None, latency_s=0.01)
    up = HealthProbe(ok=True, status_code=200, error=None, latency_s=0.01)
    assert readiness_gate(lambda: down, lambda: False, 60, 0.5, clock, clock.sleep) == "" and clock.t == 0
    answers = iter([down, down, up])
    assert readiness_gate(lambda: next(answers), lambda: True, 60, 0.5, clock, clock.sleep) == ""
    clock = Clock()
    why = readiness_gate(lambda: down, lambda: True, 5, 0.5, clock, clock.sleep)
    assert why.startswith("/readiness not 200 within 5s") and clock.t == 5.0
