"""Router pure parts: the rendered release (exact argv, the key only in the 0600 router.json), the parsers of
the router's recorded answers, and the rolling logic (RouterGuard) against a fake router that applies
add/remove like the real one (queued, then visible)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from opsctl.errors import DeployError, RemoteError
from opsctl.inventory.model import Inventory, Router
from opsctl.render import Secrets
from opsctl.router.api import Member, RouterClient, RouterError, parse_load, parse_members
from opsctl.router.keptout import KeptOutRecorder, kept_out_file, kept_out_json, parse_kept_out
from opsctl.router.render import LAUNCHER, render_router
from opsctl.router.rolling import RouterGuard
from opsctl.systemd import exec_argv, parse_unit
from tests.unit.router_fleet import TWO_REFS, fleet

SECRET = "s3cret-router-key-value"
# GET /workers of sglang-router 0.3.2, recorded (two workers, one added at run time).
RECORDED_WORKERS = {
    "workers": [
        {"id": "8b9df19a-7dc6-4c64-8a67-0bfe2f0d96dc", "url": "http://127.0.0.1:47811", "model_id": "unknown",
         "priority": 50, "cost": 1.0, "worker_type": "regular", "is_healthy": True, "load": 0,
         "connection_mode": "HTTP", "disable_health_check": False},
        {"id": "21c5392b-eb48-425c-9bb1-94b5aa00771b", "url": "http://127.0.0.1:47812", "model_id": "unknown",
         "priority": 50, "cost": 1.0, "worker_type": "regular", "is_healthy": False, "load": 3,
         "connection_mode": "HTTP", "disable_health_check": False},
    ],
    "total": 2,
    "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": 2},
}  # fmt: skip


def inventory(**router: Any) -> Inventory:
    return fleet(TWO_REFS, policy="round_robin", **router)


def test_render_exact_argv_and_secret_only_in_router_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RK", SECRET)
    inv = inventory(api_key="env:RK")
    router = inv.router("front")
    shown = render_router(inv, router, "20261201T000000Z-0123456789ab")
    real = render_router(inv, router, "20261201T000000Z-0123456789ab", Secrets.REVEAL)
    release = "/opt/opsctl/services/router-front/releases/20261201T000000Z-0123456789ab"
    assert shown.exec_start == (
        "/opt/opsctl/venv/bin/python", f"{release}/launch.py", f"{release}/router.json",
        "/var/lib/opsctl/routers/front.kept-out.json",
    )  # fmt: skip
    exec_start = next(d.value for d in parse_unit(real.unit) if d.key == "ExecStart")
    assert exec_argv(exec_start) == shown.exec_start
    assert shown.argv == (
        "--host", "0.0.0.0", "--port", "30080", "--policy", "round_robin",
        "--worker-urls", "http://10.0.0.1:30000", "http://10.0.0.2:30000",
        "--health-check-endpoint", "/health", "--health-check-interval-secs", "2",
        "--worker-startup-timeout-secs", "600", "--worker-startup-check-interval", "2",
        "--shutdown-grace-period-secs", "10", "--prometheus-host", "0.0.0.0", "--prometheus-port", "30081",
        "--log-level", "info", "--api-key", "***",
    )  # fmt: skip
    assert json.loads(real.config)["argv"] == [*shown.argv[:-1], SECRET]
    assert real.files["router.json"][1] == 0o600 and real.files["env"][1] == 0o600
    for text in (real.unit, real.env, shown.config, LAUNCHER, " ".join(real.exec_start), " ".join(real.argv)):
        assert SECRET not in text


def test_parse_members_recorded_and_malformed() -> None:
    members = parse_members(RECORDED_WORKERS)
    assert members == (
        Member("8b9df19a-7dc6-4c64-8a67-0bfe2f0d96dc", "http://127.0.0.1:47811", True, 0),
        Member("21c5392b-eb48-425c-9bb1-94b5aa00771b", "http://127.0.0.1:47812", False, 3),
    )
    for bad in ({}, {"workers": "x"}, {"workers": [{"url": "http://a"}]}, [], None):
        with pytest.raises(RouterError):
            parse_members(bad)


@pytest.mark.parametrize(
    ("body", "load"),
    [
        ([{"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 1, "num_tokens": 40}], 3),  # SGLang / reference
        ([{"dp_rank": 0, "num_reqs": 1}, {"dp_rank": 1, "num_reqs": 2, "num_waiting_reqs": 0}], 3),
        ({"num_reqs": 0, "num_waiting_reqs": 0}, 0),
        ([], None),
        ([{"num_reqs": -1}], None),
        ([{"num_reqs": "2"}], None),
        ("busy", None),
    ],
)
def test_parse_load(body: Any, load: int | None) -> None:
    assert parse_load(body) == load


def test_router_client_errors_are_one_line_and_keep_the_key_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RK", SECRET)
    inv = inventory(api_key="env:RK")

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == f"Bearer {SECRET}"
        if request.url.path == "/workers" and request.method == "GET":
            return httpx.Response(401, json={"error": "Unauthorized"})
        raise httpx.ConnectError("connection refused")

    client = RouterClient(httpx.Client(transport=httpx.MockTransport(handler)), "http://r:1", inv.routers[0].api_key)
    with pytest.raises(RouterError) as info:
        client.members()
    assert info.value.one_line() == "router http://r:1: GET /workers: HTTP 401 (check the router's api_key)"
    with pytest.raises(RouterError) as info:
        client.add("http://w:1")
    assert "ConnectError: connection refused" in info.value.one_line() and SECRET not in info.value.one_line()


class FakeRouter:
    """Applies a removal or addition one `members()` call later (the real router queues them)."""

    def __init__(self, members: list[Member], healthy_after_add: bool = True) -> None:
        self.members_now = list(members)
        self.pending: list[tuple[str, Any]] = []
        self.calls: list[str] = []
        self.healthy_after_add = healthy_after_add
        self.up = True

    def health(self) -> Any:
        return type("P", (), {"ok": self.up})()

    def members(self) -> tuple[Member, ...]:
        for op, arg in self.pending:
            if op == "remove":
                self.members_now = [m for m in self.members_now if m.id != arg.id]
            else:
                self.members_now.append(Member(f"id-{arg}", arg, self.healthy_after_add, 0))
        self.pending = []
        return tuple(self.members_now)

    def member(self, url: str) -> Member | None:
        return next((m for m in self.members() if m.url == url), None)

    def add(self, url: str) -> None:
        self.calls.append(f"add {url}")
        self.pending.append(("add", url))

    def remove(self, member: Member) -> None:
        self.calls.append(f"remove {member.url}")
        self.pending.append(("remove", member))


W1, W2 = "http://10.0.0.1:30000", "http://10.0.0.2:30000"


def guard(fake: FakeRouter, loads: list[int | None], clock: list[float]) -> RouterGuard:
    inv = inventory(drain_timeout=5)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/get_load"
        load = loads.pop(0) if len(loads) > 1 else loads[0]
        if load is None:
            return httpx.Response(404)
        return httpx.Response(200, json=[{"dp_rank": 0, "num_reqs": load, "num_waiting_reqs": 0}])

    def sleep(s: float) -> None:
        clock[0] += s

    return RouterGuard(
        inv,
        client=lambda r: fake,  # type: ignore[arg-type,return-value]
        sleep=sleep,
        clock=lambda: clock[0],
        http=httpx.Client(transport=httpx.MockTransport(handler)),
        watch_interval=None,  # reconciled by hand where a test needs it
    )


def test_take_out_drains_then_put_back_waits_for_healthy() -> None:
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    said: list[str] = []
    clock = [0.0]
    g = guard(fake, [2, 1, 0], clock)
    taken = g.take_out("h1", "ref", said.append)
    assert fake.calls == [f"remove {W1}"] and [m.url for m in fake.members()] == [W2]
    assert said[0] == "out of router front (1 other healthy worker(s) serve)"
    assert said[1] == "drained in 0.5s (nothing in flight)"
    assert g.put_back(taken, True, said.append) == ""
    assert fake.calls[-1] == f"add {W1}" and said[-1].startswith("back in router front, healthy after")
    assert g._slots["front"].slots.acquire(blocking=False)  # the slot was given back


def test_drain_is_bounded_and_shown() -> None:
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    said: list[str] = []
    g = guard(fake, [3], [0.0])
    g.take_out("h1", "ref", said.append)
    assert said[1] == "drain: 3 request(s) still in flight after 5.0s (drain_timeout): going on"


def test_worker_without_get_load_gets_a_fixed_grace() -> None:
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    said: list[str] = []
    clock = [0.0]
    guard(fake, [None], clock).take_out("h1", "ref", said.append)
    assert said[1] == f"drain: {W1} does not report its load (/get_load); waited 3.0s" and clock[0] == 3.0


def test_last_healthy_worker_is_never_taken_out() -> None:
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, False, 0)])
    g = guard(fake, [0], [0.0])
    with pytest.raises(DeployError) as info:
        g.take_out("h1", "ref", lambda _: None)
    assert "router front: h1/ref is its last healthy worker" in info.value.message
    assert fake.calls == [] and g._slots["front"].slots.acquire(blocking=False)


def test_not_serving_stays_out_and_unhealthy_add_is_reported() -> None:
    third = Member("c", "http://10.0.0.3:30000", True, 0)
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0), third], healthy_after_add=False)
    g = guard(fake, [0], [0.0])
    taken = g.take_out("h1", "ref", lambda _: None)
    assert g.put_back(taken, False, lambda _: None) == "left out of router front (not serving a healthy release)"
    assert fake.calls == [f"remove {W1}"]
    taken = g.take_out("h2", "ref", lambda _: None)
    problem = g.put_back(taken, True, lambda _: None)
    assert problem.startswith("not back in router front: timed out after 60s waiting for router front to report")


def test_a_router_that_does_not_answer_is_skipped_and_frees_its_slot() -> None:
    fake = FakeRouter([Member("a", W1, True, 0)])
    fake.up = False
    said: list[str] = []
    g = guard(fake, [0], [0.0])
    taken = g.take_out("h1", "ref", said.append)
    assert [(t.url, t.router_down) for t in taken] == [(W1, True)]
    assert "does not answer /health: deploying without it" in said[0]
    assert g._slots["front"].slots.acquire(blocking=False)
    g._slots["front"].slots.release()
    assert g.put_back(taken, True, said.append) == "" and fake.calls == []  # still down: its --worker-urls add it


def test_a_router_down_at_the_take_out_that_restarts_mid_deploy_loses_the_worker_again() -> None:
    """Down when the worker went out (killed, systemd restarting it): it came back with every worker of its
    --worker-urls, and the deploy, which had gone on without it, never took the worker out of it."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    fake.up = False
    said: list[str] = []
    g = guard(fake, [0], [0.0])
    taken = g.take_out("h1", "ref", said.append)
    fake.up = True  # restarted, both workers listed
    assert len(g.reconcile()) == 1 and [m.url for m in fake.members()] == [W2]
    assert g.put_back(taken, True, said.append) == ""  # gates passed: back in
    assert said[-1].startswith("back in router front") and {m.url for m in fake.members()} == {W1, W2}
    assert g.reconcile() == []
    # down again at the next take-out, and the deploy fails: left out, and still out once the router is back
    fake.up = False
    taken = g.take_out("h1", "ref", said.append)
    assert g.put_back(taken, False, said.append).startswith("left out of router front")
    fake.up = True
    assert len(g.reconcile()) == 1 and [m.url for m in fake.members()] == [W2]


def test_one_worker_out_at_a_time_per_router() -> None:
    """max_unavailable 1: the second take_out waits until the first worker is back."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0), Member("c", "http://x:1", True, 0)])
    g = guard(fake, [0], [0.0])
    first = g.take_out("h1", "ref", lambda _: None)
    order: list[str] = []

    def second() -> None:
        g.take_out("h2", "ref", lambda m: order.append(m))
        order.append("second out")

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(timeout=1.5)
    assert thread.is_alive() and "second out" not in order
    assert order and order[0].startswith("waiting for router front: 1 worker(s) already out")
    order.append("first back")
    g.put_back(first, True, lambda _: None)
    thread.join(timeout=5)
    assert order.index("first back") < order.index("second out")


def test_router_status_view_names_members() -> None:
    from opsctl.router.status import members_view

    inv = inventory()
    router: Router = inv.router("front")
    listed, missing = members_view(inv, router, (Member("a", W1, True, 1), Member("z", "http://9.9.9.9:1", False, 0)))
    assert [(m.worker, m.healthy, m.load) for m in listed] == [("h1/ref", True, 1), ("http://9.9.9.9:1", False, 0)]
    assert missing == ["h2/ref"]


def test_router_wheels_plan_pushes_only_when_the_stamp_differs(tmp_path: Any) -> None:
    from opsctl.ops.router_wheels import REMOTE_ROUTER_WHEELHOUSE, plan_router_wheels

    (tmp_path / "sglang_router-0.3.2-cp38-abi3-manylinux_2_17_x86_64.whl").write_bytes(b"x")
    assert plan_router_wheels(None, "", None).notes == ("no router on this host",)
    assert not plan_router_wheels(tmp_path, '{"a": 1}', '{"a": 1}\n').changes
    plan = plan_router_wheels(tmp_path, '{"a": 1}', '{"a": 2}')
    assert plan.commands() == [
        f"sudo mkdir -p {REMOTE_ROUTER_WHEELHOUSE}",
        f"push {tmp_path} -> {REMOTE_ROUTER_WHEELHOUSE}",
    ]


def test_router_lock_pins_everything_exactly() -> None:
    from opsctl.ops.locks import router_lock

    lock = router_lock("0.3.2")
    names = {line.split("==")[0] for line in lock.requirements()}
    assert all("==" in line for line in lock.requirements())
    assert {"sglang-router", "setproctitle", "aiohttp", "orjson", "uvicorn", "fastapi"} <= names
    assert ("sglang-router==0.3.2") in lock.requirements()


class StubGuard:
    def __init__(self, serving: bool = True, problem: str = "") -> None:
        self.events: list[str] = []
        self._serving = serving
        self.problem = problem

    def take_out(self, host: str, service: str, say: Any, cancelled: Any) -> list[str]:
        self.events.append(f"out {host}/{service}")
        return ["taken"]

    def serving(self, host: str, service: str) -> bool:
        return self._serving

    def put_back(self, taken: list[str], serving: bool, say: Any) -> str:
        self.events.append(f"back serving={serving}")
        return self.problem

    def ensure_in(self, host: str, service: str, say: Any) -> str:
        self.events.append(f"ensure {host}/{service}")
        return self.problem


def _ctx() -> Any:
    from opsctl.deploy.context import ServiceContext

    inv = inventory()
    host = inv.host("h1")
    return ServiceContext(host, host.service("ref"), None, None, threading.Event(), say=lambda _: None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("outcome", "serving", "problem", "put_back", "final"),
    [
        ("deployed", True, "", "back serving=True", "deployed"),
        ("rolled-back", True, "", "back serving=True", "rolled-back"),  # old release restored: back in
        ("failed", False, "", "back serving=False", "failed"),  # nothing healthy: stays out
        ("deployed", True, "not back in router front: timed out", "back serving=True", "failed"),
    ],
)
def test_behind_routers_puts_back_what_serves(
    outcome: str, serving: bool, problem: str, put_back: str, final: str
) -> None:
    from opsctl.deploy.flow import ServiceResult
    from opsctl.deploy.rollout import Outcome
    from opsctl.deploy.runner import behind_routers

    ctx = _ctx()
    guard = StubGuard(serving, problem)

    def work() -> ServiceResult:
        assert ctx.before_live is not None
        ctx.before_live()  # what deploy_service does right before the switch
        guard.events.append("switch, gates")
        return ServiceResult("h1", "ref", Outcome(outcome), message="m")

    result = behind_routers(ctx, guard, work)  # type: ignore[arg-type]
    assert guard.events == ["out h1/ref", "switch, gates", put_back]
    assert result.outcome.value == final and (problem in result.message)


def test_behind_routers_takes_nothing_out_when_nothing_goes_live() -> None:
    """Unchanged: never taken out; only made sure it is in its routers (a worker left out earlier goes back)."""
    from opsctl.deploy.flow import ServiceResult
    from opsctl.deploy.rollout import Outcome
    from opsctl.deploy.runner import behind_routers

    guard = StubGuard()
    result = behind_routers(_ctx(), guard, lambda: ServiceResult("h1", "ref", Outcome.UNCHANGED))  # type: ignore[arg-type]
    assert result.outcome is Outcome.UNCHANGED and guard.events == ["ensure h1/ref"]
    guard = StubGuard(problem="not back in router front: timed out")
    result = behind_routers(_ctx(), guard, lambda: ServiceResult("h1", "ref", Outcome.UNCHANGED))  # type: ignore[arg-type]
    assert result.outcome is Outcome.FAILED and "not back in router front" in result.message


def test_ensure_in_adds_a_serving_worker_the_router_lost() -> None:
    fake = FakeRouter([Member("b", W2, True, 0)])
    said: list[str] = []
    g = guard(fake, [0], [0.0])
    g.serving = lambda host, service: True  # type: ignore[method-assign]
    assert g.ensure_in("h1", "ref", said.append) == ""
    assert fake.calls == [f"add {W1}"] and said[0] == "not in router front: adding it"
    assert g.ensure_in("h1", "ref", said.append) == "" and fake.calls == [f"add {W1}"]  # already in: nothing


def test_plan_line_names_the_router_and_the_bound() -> None:
    g = guard(FakeRouter([]), [0], [0.0])
    assert g.plan_line("h1", "ref") == (
        "before the switch: out of router front, drained (at most 5s); back in once healthy and smoke-tested"
    )


def test_a_restarted_router_that_takes_a_worker_back_mid_deploy_loses_it_again() -> None:
    """Issue 42: a router killed during a rolling deploy came back (systemd) with every worker of its
    --worker-urls, the one whose gates had not passed included; clients got its errors (31 of 250)."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    said: list[str] = []
    g = guard(fake, [0], [0.0])
    taken = g.take_out("h1", "ref", said.append)
    assert g.reconcile() == [] and [m.url for m in fake.members()] == [W2]
    fake.members_now = [Member("a2", W1, True, 0), Member("b2", W2, True, 0)]  # restarted: both back, new ids
    assert g.reconcile() == [
        "router front lists h1/ref again (it restarted, or someone added it): taken out again until its gates pass"
    ]
    assert said[-1].startswith("router front lists h1/ref again") and fake.calls[-1] == f"remove {W1}"
    assert [m.url for m in fake.members()] == [W2]
    assert g.put_back(taken, True, said.append) == ""  # gates passed: back in, and no longer kept out
    assert g.reconcile() == [] and {m.url for m in fake.members()} == {W1, W2}


def test_a_kept_out_worker_a_restarted_router_lists_is_not_counted_as_serving() -> None:
    """h1 was left out (its deploy failed); the router restarted and lists it healthy again before the watcher's
    next look: taking h2 out on the strength of h1 would leave the router only workers opsctl keeps out."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    g = guard(fake, [0], [0.0])
    assert g.put_back(g.take_out("h1", "ref", lambda _: None), False, lambda _: None).startswith("left out")
    fake.members_now = [Member("a2", W1, True, 0), Member("b2", W2, True, 0)]  # restarted: both listed
    with pytest.raises(DeployError, match="last healthy worker"):
        g.take_out("h2", "ref", lambda _: None)
    assert [c for c in fake.calls if c.startswith("remove")] == [f"remove {W1}"]  # h2 never left


def test_a_worker_left_out_stays_out_and_the_watcher_runs_by_itself() -> None:
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    said: list[str] = []
    g = guard(fake, [0], [0.0])
    taken = g.take_out("h1", "ref", said.append)
    assert g.put_back(taken, False, said.append).startswith("left out of router front")
    fake.members_now.append(Member("a3", W1, True, 0))  # the router took it back while it serves nothing
    assert len(g.reconcile()) == 1 and [m.url for m in fake.members()] == [W2]
    # the watcher thread: started by the first take-out, stopped by close()
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    g = guard(fake, [0], [0.0])
    g.watch_interval = 0.05
    g.take_out("h1", "ref", said.append)
    fake.members_now.append(Member("a4", W1, True, 0))
    deadline = time.monotonic() + 10
    while fake.calls[-1] != f"remove {W1}" or len(fake.calls) < 2:
        assert time.monotonic() < deadline, fake.calls
        time.sleep(0.05)
    g.close()
    assert g._watcher is not None and not g._watcher.is_alive()


def test_status_shows_a_router_restart() -> None:
    from opsctl.cli.common import console
    from opsctl.cli.status import _router_table
    from opsctl.router.status import RouterStatus
    from opsctl.systemd import parse_show

    unit = parse_show(
        "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nNRestarts=1\nMainPID=4242\n"
        "ActiveEnterTimestamp=Sat 2026-12-05 08:31:02 UTC\n"
    )
    row = RouterStatus("front", "h1", "http://10.0.0.1:30080", unit, "R1", 1, 0, None, "HTTP 200 in 2 ms", True)
    with console.capture() as out:
        _router_table([row])
    assert "active/running restarts=1 since Sat 2026-12-05 08:31:02 UTC release=R1" in out.get()


FAKE_ROUTER = """
import json, os
def parse_router_args(argv):
    return argv
def launch_router(argv):
    with open(os.environ["LAUNCHED"], "w") as f:
        json.dump(argv, f)
"""


@pytest.mark.parametrize(
    ("kept_out", "started_with"),
    [
        (None, ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]),  # no file: every worker
        ('{"kept_out": ["http://10.0.0.2:30000"]}', ["http://10.0.0.1:30000"]),
        ('{"kept_out": ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]}', []),
        ("not json", ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]),  # unreadable: nobody kept out
        ('{"kept_out": "http://10.0.0.2:30000"}', ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]),
    ],
)
def test_the_launcher_starts_the_router_without_the_workers_opsctl_keeps_out(
    tmp_path: Path, kept_out: str | None, started_with: list[str]
) -> None:
    """The release's launch.py, run by Python with a stand-in sglang_router: `--worker-urls` loses the workers of
    the kept-out file and nothing else; the other flags and their order stay."""
    rendered = render_router(inventory(), inventory().router("front"), "20261201T000000Z-0123456789ab")
    (tmp_path / "sglang_router").mkdir()
    (tmp_path / "sglang_router" / "__init__.py").write_text("")
    (tmp_path / "sglang_router" / "launch_router.py").write_text(FAKE_ROUTER)
    for name, (text, _mode) in rendered.files.items():
        (tmp_path / name).write_text(text)
    kept = tmp_path / "kept-out.json"
    if kept_out is not None:
        kept.write_text(kept_out)
    launched = tmp_path / "argv.json"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LAUNCHED": str(launched)}
    subprocess.run(
        [sys.executable, str(tmp_path / "launch.py"), str(tmp_path / "router.json"), str(kept)], env=env, check=True
    )
    argv = json.loads(launched.read_text())
    start = argv.index("--worker-urls") + 1
    assert argv[start : start + len(started_with)] == started_with
    assert argv[start + len(started_with)] == "--health-check-endpoint"
    assert [a for a in argv if not a.startswith("http")] == [a for a in rendered.argv if not a.startswith("http")]


class FakeKeptOut:
    """The kept-out store, logging into the fake router's call list (the order of the two is the point)."""

    def __init__(self, fake: FakeRouter, fail: bool = False) -> None:
        self.fake = fake
        self.fail = fail
        self.urls: set[str] = set()

    def keep_out(self, router: Any, url: str) -> None:
        self._change(f"keep {url}", self.urls | {url})

    def let_in(self, router: Any, url: str) -> None:
        self._change(f"let {url}", self.urls - {url})

    def _change(self, call: str, after: set[str]) -> None:
        if self.fail:
            raise RemoteError("h9", "cat", 255, message="h9: unreachable: connection refused")
        self.fake.calls.append(call)
        self.urls = after

    def close(self) -> None:
        pass


def test_kept_out_workers_are_recorded_before_the_router_is_changed() -> None:
    """A router restarting at any moment of a rolling deploy starts with what the file says: the worker is in
    the file before it leaves the router and out of the file before it comes back."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    g = guard(fake, [0], [0.0])
    g.kept_out = store = FakeKeptOut(fake)
    taken = g.take_out("h1", "ref", lambda _: None)
    assert fake.calls == [f"keep {W1}", f"remove {W1}"] and store.urls == {W1}
    assert g.put_back(taken, True, lambda _: None) == ""
    assert fake.calls[2:] == [f"let {W1}", f"add {W1}"] and store.urls == set()
    # a worker that serves nothing healthy stays out of the router, and of its next start
    taken = g.take_out("h1", "ref", lambda _: None)
    g.put_back(taken, False, lambda _: None)
    assert store.urls == {W1}
    # a router that is down at the take-out (systemd restarting it) is still told
    fake.up = False
    g2 = guard(fake, [0], [0.0])
    g2.kept_out = store2 = FakeKeptOut(fake)
    taken = g2.take_out("h2", "ref", lambda _: None)
    assert store2.urls == {W2}
    # still down when the gates passed: the file lets it in for the router's next start (the first deploy of a
    # fleet deploys its router after the services)
    assert g2.put_back(taken, True, lambda _: None) == "" and store2.urls == set()


def test_a_kept_out_file_that_cannot_be_written_is_said_and_the_deploy_goes_on() -> None:
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    said: list[str] = []
    g = guard(fake, [0], [0.0])
    g.kept_out = FakeKeptOut(fake, fail=True)
    taken = g.take_out("h1", "ref", said.append)
    assert fake.calls == [f"remove {W1}"]
    assert said[0].startswith("router front: could not record on h1 which workers it starts without (")
    assert said[0].endswith(f"should it restart now, it takes {W1} back until opsctl takes it out again")
    assert g.put_back(taken, True, said.append) == ""


def test_the_recorder_changes_one_url_and_writes_only_a_change() -> None:
    files: dict[str, str] = {}
    writes: list[str] = []

    class Conn:
        def run(self, cmd: Any, timeout: float | None = None, check: bool = True) -> Any:
            argv = list(cmd.argv)
            out = files.get(argv[-1], "") if argv[0] == "cat" else ""
            return type("R", (), {"stdout": out})()

        def put_text(self, text: str, path: str, mode: int = 0o644) -> None:
            files[path] = text
            writes.append(text)

        def close(self) -> None:
            pass

    inv = inventory()
    recorder = KeptOutRecorder(inv, connect=lambda host: Conn())  # type: ignore[arg-type,return-value]
    router = inv.router("front")
    recorder.keep_out(router, W1)
    recorder.keep_out(router, W2)
    recorder.keep_out(router, W2)  # no change: nothing written
    recorder.let_in(router, W1)
    assert writes == [kept_out_json([W1]), kept_out_json([W1, W2]), kept_out_json([W2])]
    assert parse_kept_out(files[kept_out_file("front")]) == (W2,)
    assert parse_kept_out("") == () and parse_kept_out('{"kept_out": [1]}') == () and parse_kept_out("[") == ()
