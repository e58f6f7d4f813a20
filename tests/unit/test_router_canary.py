"""The canary's plan and its Ctrl-C path, with the deploy runner and the router's HTTP answers scripted (the
real thing runs in tests/lab/test_router.py): an interrupt while measuring rolls the canary back to the
release it replaced, audits it and leaves the rest untouched."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from opsctl.deploy import runner
from opsctl.deploy.flow import DeploySettings, ServiceResult
from opsctl.deploy.rollout import Outcome
from opsctl.deploy.runner import RolloutOptions, RunReport
from opsctl.inventory.load import parse_inventory
from opsctl.inventory.model import Inventory, WorkerRef
from opsctl.remote.fake import FakeHost
from opsctl.router import canary as canary_mod
from opsctl.router.canary import Canary, fronted_selection, plan_lines, split
from tests.unit.test_router_inventory import BASE


def inventory(**block: Any) -> Inventory:
    data = copy.deepcopy(BASE)
    data["routers"]["front"].update(services=["h1/a", "h2/a"], canary={"window": 5, **block})
    return parse_inventory(data)


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
    assert "compare for 5s of live traffic: >= 20 requests each" in lines[1]
    assert lines[2] == "then promote h1/b, h2/a (rolling) or roll the canary back"
    plain = parse_inventory(copy.deepcopy(BASE))
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
