import httpx
import pytest

from opsctl import health
from opsctl.errors import DeployError
from opsctl.health import HealthProbe
from opsctl.kernel.gate import GateConfig, Interrupted, health_gate
from opsctl.systemd import UnitState, parse_show, show_cmd

SHOW_ACTIVE = """LoadState=loaded
ActiveState=active
SubState=running
Result=success
NRestarts=0
MainPID=4242
ActiveEnterTimestamp=Sun 2026-11-29 22:40:01 UTC
"""
SHOW_AUTORESTART = """LoadState=loaded
ActiveState=activating
SubState=auto-restart
Result=exit-code
NRestarts=1
MainPID=0
ActiveEnterTimestamp=
"""


def test_parse_show():
    u = parse_show(SHOW_ACTIVE)
    assert u == UnitState("loaded", "active", "running", "success", 0, 4242, "Sun 2026-11-29 22:40:01 UTC")
    assert u.running
    r = parse_show(SHOW_AUTORESTART)
    assert r.n_restarts == 1 and r.sub_state == "auto-restart" and not r.running
    with pytest.raises(DeployError):
        parse_show("Failed to connect to bus")
    assert show_cmd("opsctl-a.service").display() == (
        "systemctl show -p LoadState,ActiveState,SubState,Result,NRestarts,MainPID,ActiveEnterTimestamp -- "
        "opsctl-a.service"
    )


def _unit(state="active", sub="running", restarts=0):
    return UnitState("loaded", state, sub, "success", restarts, 1, "")


OK = HealthProbe(True, 200, None, 0.01)
LOADING = HealthProbe(False, 503, None, 0.01)
REFUSED = HealthProbe(False, None, "connection refused", 0.01)


class Script:
    """Answers from a timeline: each read returns the state for the current fake time."""

    def __init__(self, units, probes):
        self.t = 0.0
        self.units = units  # list of (from_time, UnitState)
        self.probes = probes  # list of (from_time, HealthProbe)

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s

    def _at(self, timeline):
        return [v for t, v in timeline if t <= self.t][-1]

    def unit(self):
        return self._at(self.units)

    def probe(self):
        return self._at(self.probes)


CFG = GateConfig(timeout=60, readiness_delay=10, poll_s=1)


def _run(script, baseline=0, cfg=CFG, cancelled=lambda: False):
    return health_gate(script.unit, script.probe, baseline, cfg, script.clock, script.sleep, cancelled)


def test_gate_passes_after_loading():
    s = Script([(0, _unit())], [(0, REFUSED), (3, LOADING), (7, OK)])
    r = _run(s)
    assert r.ok and r.time_to_healthy == 7.0
    assert s.t >= 17.0  # waited the readiness delay before the second check


def test_gate_fails_on_crash_loop_during_start():
    # bad flag: the server exits at once; systemd auto-restarts it (NRestarts moves)
    s = Script([(0, _unit("activating", "start")), (2, _unit("activating", "auto-restart", 1))], [(0, REFUSED)])
    r = _run(s)
    assert not r.ok and "NRestarts 0 -> 1" in r.reason and s.t < 5


def test_gate_fails_on_failed_unit():
    s = Script([(0, _unit("failed", "failed"))], [(0, REFUSED)])
    r = _run(s)
    assert not r.ok and "the unit is failed/failed" in r.reason


def test_gate_times_out_with_last_probe():
    s = Script([(0, _unit())], [(0, LOADING)])
    r = _run(s, cfg=GateConfig(timeout=5, readiness_delay=10, poll_s=1))
    assert not r.ok and "no HTTP 200 from /health within 5s" in r.reason and "HTTP 503" in r.reason


def test_second_check_catches_crash_after_healthy():
    # healthy at t=4, crashes at t=9 (5 s later), systemd restarts it: NRestarts 1 at the re-check
    s = Script([(0, _unit()), (9, _unit("activating", "auto-restart", 1))], [(0, REFUSED), (4, OK), (9, REFUSED)])
    r = _run(s)
    assert not r.ok and r.reason.startswith("second check after 10s") and "NRestarts" in r.reason
    assert r.time_to_healthy == 4.0


def test_second_check_catches_unhealthy_http():
    s = Script([(0, _unit())], [(0, OK), (5, LOADING)])
    r = _run(s)
    assert not r.ok and "second check" in r.reason and "HTTP 503" in r.reason


def test_second_check_tolerates_one_slow_probe():
    s = Script([(0, _unit())], [(0, OK), (5, REFUSED), (11, OK)])
    assert _run(s).ok


def test_gate_baseline_restarts():
    # NRestarts was already 3 before the restart; only a change counts
    s = Script([(0, _unit(restarts=3))], [(0, OK)])
    assert _run(s, baseline=3).ok


def test_gate_cancel():
    s = Script([(0, _unit())], [(0, LOADING)])
    with pytest.raises(Interrupted):
        _run(s, cancelled=lambda: s.t >= 3)


def test_probe_translates_errors():
    def refuse(request):
        raise httpx.ConnectError("[Errno 111] Connection refused")

    def slow(request):
        raise httpx.ReadTimeout("timed out")

    with httpx.Client(transport=httpx.MockTransport(refuse)) as c:
        p = health.probe(c, "http://h:1/health")
    assert not p.ok and p.status_code is None and p.error == "connection refused"
    with httpx.Client(transport=httpx.MockTransport(slow)) as c:
        p = health.probe(c, "http://h:1/health", timeout=2)
    assert not p.ok and p.error == "timed out after 2s"
    with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503))) as c:
        p = health.probe(c, "http://h:1/health")
    assert not p.ok and p.status_code == 503 and p.describe() == "HTTP 503"
    with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200))) as c:
        assert health.probe(c, "http://h:1/health").ok
