"""The canary's plan and its Ctrl-C path, with the deploy runner and the router's HTTP answers scripted (the
real thing runs in tests/lab/test_router.py): an interrupt while measuring rolls the canary back to the
release it replaced, audits it and leaves the rest untouched."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest

from opsctl.deploy.flow import DeploySettings, ServiceResult
from opsctl.deploy.outcome import Outcome
from opsctl.inventory.model import Inventory, WorkerRef
from opsctl.kernel import audit
from opsctl.remote.fake import FakeHost
from opsctl.rollout import canary as canary_mod
from opsctl.rollout import runner
from opsctl.rollout.canary import Canary, fronted_selection, plan_lines, split
from opsctl.rollout.judge import Decision, Replay
from opsctl.rollout.runner import RolloutOptions, RunReport
from tests.unit.router_fleet import fleet


def inventory(**block: Any) -> Inventory:  # window 5 unless given
    return fleet(services=["h1/a", "h2/a"], canary={"window": 5, **block})


def selection(inv: Inventory) -> list[Any]:
    return [(h, list(h.services)) for h in inv.hosts]


def test_split_and_plan() -> None:
    inv = inventory()
    router = fronted_selection(inv, selection(inv))
    assert router is not None and router.name == "front"
    assert split(router, selection(inv)) == (
        [WorkerRef("h1", "a")], [WorkerRef("h2", "a")], [WorkerRef("h1", "b"), WorkerRef("h2", "a")],
    )  # fmt: skip
    lines = plan_lines(router, selection(inv))
    assert lines[0].startswith("canary behind router front: h1/a first (drain-aware deploy); h2/a stay")
    assert lines[1].startswith("compare for 5s of live traffic (a look every 5s; a self-check failure, a restart")
    assert "on up to 15s while traffic is short): >= 20 requests each" in lines[1]
    assert lines[2] == "then promote h1/b, h2/a (rolling) or roll the canary back"
    plain = fleet()
    assert fronted_selection(plain, selection(plain)) is None


def test_ctrl_c_while_measuring_rolls_the_canary_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    inv = inventory()
    router = inv.router("front")
    calls: list[tuple[str, list[str], str | None]] = []

    def deploy(sel: Any, *args: Any, **kwargs: Any) -> RunReport:
        names = [f"{h.name}/{s.name}" for h, svcs in sel for s in svcs]
        calls.append(("deploy", names, None))
        return RunReport("deploy", [ServiceResult("h1", "a", Outcome.DEPLOYED, "R-new", "R-old")])

    def rollback(sel: Any, settings: Any, options: Any, say: Any, to: str | None = None, *a: Any) -> RunReport:
        calls.append(("rollback", [f"{h.name}/{s.name}" for h, svcs in sel for s in svcs], to))
        return RunReport("rollback", [ServiceResult("h1", "a", Outcome.REVERTED, "R-old", "R-new")])

    monkeypatch.setattr(runner, "deploy", deploy)
    monkeypatch.setattr(runner, "rollback", rollback)
    answer = {"workers": [{"id": "1", "url": "http://10.0.0.1:30000", "is_healthy": True},
                          {"id": "2", "url": "http://10.0.0.2:30000", "is_healthy": True}]}  # fmt: skip
    hosts: dict[str, FakeHost] = {}

    def connect(host: Any) -> FakeHost:
        return hosts.setdefault(host.name, FakeHost(host.name))

    job = Canary(inv, router, selection(inv), lambda _: None, connect)
    job.http = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json=answer)))

    def interrupted(*_: Any, **__: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "measure", interrupted)
    report, state = job.run(None, DeploySettings(), RolloutOptions())  # type: ignore[arg-type]
    assert calls == [("deploy", ["h1/a"], None), ("rollback", ["h1/a"], "R-old")]
    assert report.interrupted and state.phase == "interrupted"
    assert [(r.service, r.outcome) for r in report.results] == [("a", Outcome.ROLLED_BACK)]
    ran = hosts["h1"].ran
    assert any("R-new/BAD" in line or ("mark" in line and "R-new" in line) for line in ran), ran
    audit = (tmp_path / "opsctl" / "audit.log").read_text()
    assert "action=canary-start" in audit and "action=canary release=- result=interrupted" in audit
    assert canary_mod.state_path(router) in hosts["h1"].files


def test_the_canary_audits_into_its_inventorys_own_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The canary's lines land in the log of the inventory file, beside the same run's deploy lines (they used
    to land in the catch-all log), and on the router's host."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    where = str(tmp_path / "fleet.yaml")
    inv = inventory()
    inv = dataclasses.replace(inv, hosts=tuple(dataclasses.replace(h, inventory=where) for h in inv.hosts))
    router = inv.router("front")
    monkeypatch.setattr(
        runner,
        "deploy",
        lambda *a, **k: RunReport("deploy", [ServiceResult("h1", "a", Outcome.DEPLOYED, "R-new", "R-old")]),
    )
    monkeypatch.setattr(
        runner,
        "rollback",
        lambda *a, **k: RunReport("rollback", [ServiceResult("h1", "a", Outcome.REVERTED, "R-old", "R-new")]),
    )
    hosts: dict[str, FakeHost] = {}
    job = Canary(inv, router, selection(inv), lambda _: None, lambda h: hosts.setdefault(h.name, FakeHost(h.name)))
    answer = {"workers": [{"id": "1", "url": "http://10.0.0.1:30000", "is_healthy": True},
                          {"id": "2", "url": "http://10.0.0.2:30000", "is_healthy": True}]}  # fmt: skip
    job.http = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200, json=answer)))

    def interrupted(*_: Any, **__: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "measure", interrupted)
    job.run(None, DeploySettings(), RolloutOptions())  # type: ignore[arg-type]
    own = audit.local_log_path(where).read_text().splitlines()
    assert [ln.split(" action=")[1].split(" ")[0] for ln in own] == ["canary-start", "canary"]
    assert all(ln.endswith(f"inventory={where}") and f"service={router.unit_base}" in ln for ln in own)
    assert not (tmp_path / "opsctl" / "audit.log").exists()
    assert sum("audit.log" in c and "action=canary" in c for c in hosts[router.host].ran) == 2


class Fleet:
    """Two workers under scripted traffic: each /metrics scrape is a later moment (10 requests and 40 tokens
    more per look); the canary's tokens come `slow` times slower; its journal says what `journal` holds; it
    refuses `refuse` requests more per look (answered 400: counted by the router, not by the worker)."""

    def __init__(self, slow: float = 1.0, journal: str = "", restarts: int = 0, refuse: int = 0) -> None:
        self.slow, self.journal, self.restarts, self.refuse = slow, journal, restarts, refuse
        self.scrapes: dict[str, int] = {}

    def router(self) -> httpx.Response:
        """sglang-router 0.3.2's per-worker outcomes (names as tests/fixtures/router/metrics-0.3.2-*.txt)."""
        n = self.scrapes["router"] = self.scrapes.get("router", -1) + 1
        name = "smg_worker_cb_outcomes_total"
        return httpx.Response(200, text=(
            f'{name}{{worker="http://10.0.0.1:30000",outcome="success"}} {10 * n}\n'
            f'{name}{{worker="http://10.0.0.2:30000",outcome="success"}} {10 * n}\n'
            + (f'{name}{{worker="http://10.0.0.1:30000",outcome="failure"}} {self.refuse * n}\n' if n else "")
        ))  # fmt: skip

    def metrics(self, request: httpx.Request) -> httpx.Response:
        if request.url.port == 30081:  # the router's Prometheus port (its port + 1)
            return self.router()
        host = request.url.host
        n = self.scrapes[host] = self.scrapes.get(host, -1) + 1
        fast = 40 * n if host == "10.0.0.2" or self.slow == 1.0 else 0  # the canary's all past 0.01 s
        m = 'model_name="tiny"'
        return httpx.Response(200, text=(
            f"sglang:num_requests_total{{{m}}} {10 * n}\nsglang:num_aborted_requests_total{{{m}}} 0\n"
            f'sglang:inter_token_latency_seconds_bucket{{le="0.01",{m}}} {fast}\n'
            f'sglang:inter_token_latency_seconds_bucket{{le="{0.01 * self.slow}",{m}}} {40 * n}\n'
            f'sglang:inter_token_latency_seconds_bucket{{le="+Inf",{m}}} {40 * n}\n'
        ))  # fmt: skip

    def host(self, name: str) -> FakeHost:
        def answer(cmd: Any) -> tuple[int, str, str] | None:
            if "systemctl show" in cmd.display():
                restarts = self.restarts if name == "h1" and self.scrapes.get("10.0.0.1", 0) > 0 else 0
                return 0, f"ActiveState=active\nNRestarts={restarts}\n", ""
            if "journalctl" in cmd.display():
                return 0, self.journal if name == "h1" else "", ""
            return None

        return FakeHost(name, handler=answer)


def scripted(fleet: Fleet, **block: Any) -> tuple[Canary, list[float], list[str]]:
    inv = inventory(**{"min_requests": 10, **block})
    now = [0.0]
    said: list[str] = []
    hosts: dict[str, FakeHost] = {}

    def sleep(s: float) -> None:
        now[0] += s

    job = Canary(inv, inv.router("front"), selection(inv), said.append,
                 lambda h: hosts.setdefault(h.name, fleet.host(h.name)), clock=lambda: now[0], sleep=sleep)  # fmt: skip
    job.http = httpx.Client(transport=httpx.MockTransport(fleet.metrics))
    return job, now, said


def test_measure_looks_every_tick_and_promotes_an_equal_canary_at_the_window() -> None:
    job, now, said = scripted(Fleet())
    verdict = job.measure()
    assert verdict.decision is Decision.PROMOTE and now[0] == 5.0  # window 5 s: one look, at its end
    assert job.report.table[-1] == "verdict: PROMOTE (every rule passed)"
    job, now, said = scripted(Fleet(), window=20)
    assert job.measure().promote and now[0] == 20.0
    assert [line.split(":")[1].strip() for line in said] == ["5s", "10s", "15s"]  # three looks said on
    assert said[0].startswith("canary: 5s: window open, 5/20s; requests 10 vs 10")


def test_measure_rolls_back_a_slow_canary_and_a_crashing_one_at_once() -> None:
    job, now, _ = scripted(Fleet(slow=10.0), window=20)
    verdict = job.measure()
    assert verdict.decision is Decision.ROLL_BACK and now[0] == 20.0
    assert verdict.reason.startswith("ITL p95 95.5 ms vs 9.5 ms (needs 10.05x <= 1.5x)"), verdict.reason
    job, now, _ = scripted(Fleet(restarts=1), window=300)
    crashed = job.measure()
    assert crashed.decision is Decision.ROLL_BACK and now[0] == 30.0  # the first look, not the window's end
    assert crashed.reason == "restarts 1 vs 0 (needs <= 0)"
    job, now, _ = scripted(Fleet(journal="DDTREE self-check FAILED: round 3 ...\n"), window=300)
    assert job.measure().reason == "self-check failures 1 vs 0 (needs <= 0)" and now[0] == 30.0


def test_a_canary_refusing_requests_the_old_group_serves_is_rolled_back_at_the_first_look() -> None:
    job, now, _ = scripted(Fleet(refuse=5), window=300)
    verdict = job.measure()
    assert verdict.decision is Decision.ROLL_BACK and now[0] == 30.0  # the first look, not the window's end
    assert verdict.reason == "refused 5 (33.33%) vs 0 (0.00%) (needs < 5 or <= old + 1.00%)"
    assert any(line.startswith("requests  ") and "15" in line for line in job.report.table), job.report.table
    job, now, _ = scripted(Fleet(refuse=1), window=20)  # 4 refusals of 44 at the window's end: the error rate
    late = job.measure()
    assert late.decision is Decision.ROLL_BACK and now[0] == 20.0
    assert late.reason.startswith("error rate 9.09% vs 0.00% (needs <= old + 1.00%)"), late.reason


def test_an_unread_router_is_no_comparison_yet() -> None:
    fleet = Fleet()
    job, now, said = scripted(fleet, window=5, max_window=10)

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503) if request.url.port == 30081 else fleet.metrics(request)

    job.http = httpx.Client(transport=httpx.MockTransport(answer))
    verdict = job.measure()
    assert verdict.decision is Decision.ROLL_BACK and now[0] == 10.0
    assert "/metrics unread (router /metrics: HTTP 503)" in said[0]


def test_differing_replay_rolls_back_without_waiting_and_quiet_traffic_measures_on() -> None:
    job, now, _ = scripted(Fleet(), window=300)
    verdict = job.measure(Replay(1, 0, "prompt p1 differs at token 0"))
    assert verdict.decision is Decision.ROLL_BACK and now[0] == 0.0  # not "requests 0 vs 0" too: not judged yet
    assert (
        verdict.reason
        == "greedy replay 0/1 equal vs reference (needs all identical tokens): prompt p1 differs at token 0"
    )
    job, now, said = scripted(Fleet(), window=5, min_requests=1000, max_window=12)
    last = job.measure()
    assert last.decision is Decision.ROLL_BACK and now[0] == 12.0 and last.reason.startswith("requests 30 vs 30")
    assert "too little traffic (10 and 10 requests, needs 1000 each), measuring on up to 12s" in said[0]


def test_a_slow_canary_is_rolled_back_by_itself_and_audited(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    calls: list[tuple[str, list[str]]] = []

    def deploy(sel: Any, *args: Any, **kwargs: Any) -> RunReport:
        calls.append(("deploy", [f"{h.name}/{s.name}" for h, svcs in sel for s in svcs]))
        return RunReport("deploy", [ServiceResult("h1", "a", Outcome.DEPLOYED, "R-new", "R-old")])

    def rollback(sel: Any, *args: Any, **kwargs: Any) -> RunReport:
        calls.append(("rollback", [f"{h.name}/{s.name}" for h, svcs in sel for s in svcs]))
        return RunReport("rollback", [ServiceResult("h1", "a", Outcome.REVERTED, "R-old", "R-new")])

    monkeypatch.setattr(runner, "deploy", deploy)
    monkeypatch.setattr(runner, "rollback", rollback)
    fleet = Fleet(slow=10.0)
    job, now, said = scripted(fleet, window=10, replay=0)
    members = {"workers": [{"id": "1", "url": "http://10.0.0.1:30000", "is_healthy": True},
                           {"id": "2", "url": "http://10.0.0.2:30000", "is_healthy": True}]}  # fmt: skip

    def answer(request: httpx.Request) -> httpx.Response:
        return fleet.metrics(request) if request.url.path == "/metrics" else httpx.Response(200, json=members)

    job.http = httpx.Client(transport=httpx.MockTransport(answer))
    report, state = job.run(None, DeploySettings(), RolloutOptions())  # type: ignore[arg-type]
    assert calls == [("deploy", ["h1/a"]), ("rollback", ["h1/a"])]  # the rest (h1/b, h2/a) never deployed
    assert state.phase == "rolled-back" and state.verdict == "roll back" and now[0] == 10.0
    assert [(r.host, r.service, r.outcome) for r in report.results] == [("h1", "a", Outcome.ROLLED_BACK)]
    assert state.message.startswith("canary rolled back: ITL p95 95.5 ms vs 9.5 ms")
    assert any(line.startswith("canary: ITL p95") and line.endswith("FAIL") for line in said), said
    audit = (tmp_path / "opsctl" / "audit.log").read_text()
    assert "action=canary-verdict release=- result=roll-back" in audit and "result=rolled-back" in audit


def test_an_interrupted_canary_leaves_no_continue_verdict(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Status kept showing the last look's `verdict: CONTINUE (window open ...)` after Ctrl-C."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setattr(runner, "deploy", lambda *a, **k: RunReport("deploy", [
        ServiceResult("h1", "a", Outcome.DEPLOYED, "R-new", "R-old")]))  # fmt: skip
    monkeypatch.setattr(runner, "rollback", lambda *a, **k: RunReport("rollback", [
        ServiceResult("h1", "a", Outcome.REVERTED, "R-old", "R-new")]))  # fmt: skip
    fleet = Fleet()
    inv = inventory(min_requests=10, window=20, replay=0)
    now = [0.0]
    hosts: dict[str, FakeHost] = {}

    def sleep(s: float) -> None:
        if now[0] >= 5.0:  # after the first look (at 5 s): Ctrl-C
            raise KeyboardInterrupt
        now[0] += s

    job = Canary(inv, inv.router("front"), selection(inv), lambda _: None,
                 lambda h: hosts.setdefault(h.name, fleet.host(h.name)), clock=lambda: now[0], sleep=sleep)  # fmt: skip
    members = {"workers": [{"id": "1", "url": "http://10.0.0.1:30000", "is_healthy": True},
                           {"id": "2", "url": "http://10.0.0.2:30000", "is_healthy": True}]}  # fmt: skip

    def answer(request: httpx.Request) -> httpx.Response:
        return fleet.metrics(request) if request.url.path == "/metrics" else httpx.Response(200, json=members)

    job.http = httpx.Client(transport=httpx.MockTransport(answer))
    _, state = job.run(None, DeploySettings(), RolloutOptions())  # type: ignore[arg-type]
    assert state.phase == "interrupted" and state.table[0].startswith("metric")
    assert state.table[-1] == "verdict: NONE (interrupted: interrupted: canary rolled back, the old release serves)"
    saved = hosts["h1"].files[canary_mod.state_path(inv.router("front"))]
    assert "CONTINUE" not in str(saved) and "verdict: NONE" in str(saved)
