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
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.deploy.lock import LockInfo
from opsctl.errors import DeployError, RemoteError
from opsctl.inventory.model import Inventory, Router
from opsctl.render import Secrets
from opsctl.rollout.rolling import RouterGuard
from opsctl.router.api import Member, RouterClient, RouterError, parse_load, parse_members
from opsctl.router.keptout import (
    KeptOutRecorder,
    Membership,
    MemoryMembership,
    Verdict,
    change,
    decide_take_out,
    kept_out_file,
    kept_out_json,
    parse_kept_out,
    parse_membership,
)
from opsctl.router.render import LAUNCHER, render_router
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
    from opsctl.kernel.locks import router_lock

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
    from opsctl.deploy.outcome import Outcome
    from opsctl.rollout.runner import behind_routers

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
    from opsctl.deploy.outcome import Outcome
    from opsctl.rollout.runner import behind_routers

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
    """A router killed during a rolling deploy came back (systemd) with every worker of its
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


class FakeKeptOut(MemoryMembership):
    """The membership store, logging each change of the kept-out set into the fake router's call list (the order
    of the two is the point)."""

    def __init__(self, fake: FakeRouter, fail: bool = False) -> None:
        super().__init__()
        self.fake = fake
        self.fail = fail

    @property
    def urls(self) -> set[str]:
        return set(parse_kept_out(self.files.get("front", "")))

    def read(self, router: Any) -> tuple[str, Membership]:
        if self.fail:
            raise RemoteError("h9", "cat", 255, message="h9: unreachable: connection refused")
        return super().read(router)

    def swap(self, router: Any, version: str, after: Membership) -> bool:
        before = self.urls
        done = super().swap(router, version, after)
        if done:
            self.fake.calls += [f"keep {u}" for u in sorted(after.kept_out - before)]
            self.fake.calls += [f"let {u}" for u in sorted(before - after.kept_out)]
        return done


def test_kept_out_workers_are_recorded_before_the_router_is_changed() -> None:
    """A router restarting at any moment of a rolling deploy starts with what the file says: the worker is in
    the file before it leaves the router and out of the file before it comes back."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    g = guard(fake, [0], [0.0])
    g.kept_out = store = FakeKeptOut(fake)
    taken = g.take_out("h1", "ref", lambda _: None)
    assert fake.calls == [f"keep {W1}", f"remove {W1}"] and store.urls == {W1}
    assert state(store).lease(W1) is not None  # this deploy holds W1 out
    assert g.put_back(taken, True, lambda _: None) == ""
    assert fake.calls[2:] == [f"let {W1}", f"add {W1}"] and store.urls == set()
    assert state(store).deploys == ()  # the lease went once W1 was healthy in the router
    # a worker that serves nothing healthy stays out of the router, and of its next start
    taken = g.take_out("h1", "ref", lambda _: None)
    g.put_back(taken, False, lambda _: None)
    assert store.urls == {W1} and state(store).deploys == ()
    # a router that is down at the take-out (systemd restarting it) is still told
    fake.up = False
    g2 = guard(fake, [0], [0.0])
    g2.kept_out = store2 = FakeKeptOut(fake)
    taken = g2.take_out("h2", "ref", lambda _: None)
    assert store2.urls == {W2}
    # still down when the gates passed: the file lets it in for the router's next start (the first deploy of a
    # fleet deploys its router after the services)
    assert g2.put_back(taken, True, lambda _: None) == "" and store2.urls == set()


def test_a_membership_file_that_cannot_be_read_refuses_the_take_out() -> None:
    """Without the router's membership file no deploy can tell whether another operator holds a worker out:
    refused before anything changes, in one line."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    g = guard(fake, [0], [0.0])
    g.kept_out = FakeKeptOut(fake, fail=True)
    with pytest.raises(DeployError) as info:
        g.take_out("h1", "ref", lambda _: None)
    assert info.value.message == (
        "router front: cannot read or write its membership on h1 (h9: unreachable: connection refused), so whether "
        "another deploy holds a worker out is unknown"
    )
    assert info.value.hint is not None and info.value.hint.startswith("nothing was switched")
    assert fake.calls == [] and g._slots["front"].slots.acquire(blocking=False)


def state(store: MemoryMembership) -> Membership:
    return parse_membership(store.files.get("front", ""))


def _two_processes(fake: FakeRouter, store: MemoryMembership, clock: list[float]) -> tuple[RouterGuard, RouterGuard]:
    """Two RouterGuards (two opsctl processes) sharing one router and one membership file, as two operators on
    two machines do."""
    first, second = guard(fake, [0], clock), guard(fake, [0], clock)
    first.kept_out = second.kept_out = store
    return first, second


def test_a_second_operator_waits_for_the_first_and_never_empties_the_router() -> None:
    """Before, each process had its own slot and last-healthy lock: both took their worker out and /workers was
    empty. Now the second reads the first's lease, says it waits, and goes once the first worker is back."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    clock = [0.0]
    store = MemoryMembership()
    first, second = _two_processes(fake, store, clock)
    taken = first.take_out("h1", "ref", lambda _: None)
    said: list[str] = []
    polls = [0]

    def sleep(s: float) -> None:  # the first deploy ends while the second waits
        clock[0] += s
        polls[0] += 1
        assert [m.url for m in fake.members()] == [W2]  # never empty meanwhile
        if polls[0] == 20:
            assert first.put_back(taken, True, lambda _: None) == ""

    second.sleep = sleep
    taken2 = second.take_out("h2", "ref", said.append)
    assert said[0].startswith("waiting for router front (0s of at most 1800s): 1 worker(s) out already")
    assert "h1/ref out for a deploy by " in said[0]
    assert said[1] == "waiting for router front (30s of at most 1800s): " + said[0].split("): ", 1)[1]
    assert any(line == "router front: free after 40.0s" for line in said), said
    assert [m.url for m in fake.members()] == [W1]
    assert [u for u, _ in state(store).deploys] == [W2]  # type: ignore[arg-type]
    assert second.put_back(taken2, True, lambda _: None) == ""
    assert {m.url for m in fake.members()} == {W1, W2} and state(store) == Membership()  # type: ignore[arg-type]


def test_with_two_slots_the_loser_waits_instead_of_hearing_last_healthy_worker() -> None:
    """max_unavailable 2 lets both in by count, but the second worker is the last that serves: before, it was
    refused ("last healthy worker") and its good release marked BAD; now it waits for the first to come back."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    clock = [0.0]
    store = MemoryMembership()
    first, second = _two_processes(fake, store, clock)
    first.inventory = second.inventory = inventory(drain_timeout=5, max_unavailable=2)
    taken = first.take_out("h1", "ref", lambda _: None)

    def sleep(s: float) -> None:
        clock[0] += s
        first.put_back(taken, True, lambda _: None)

    second.sleep = sleep
    said: list[str] = []
    second.take_out("h2", "ref", said.append)
    assert said[0].startswith("waiting for router front (0s of at most 1800s): no other worker serves until it is")
    assert [m.url for m in fake.members()] == [W1]


def test_a_wait_is_bounded_and_says_who_holds_the_router_in_one_line() -> None:
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    clock = [0.0]
    first, second = _two_processes(fake, MemoryMembership(), clock)
    first.take_out("h1", "ref", lambda _: None)
    second.wait_s = 60
    with pytest.raises(DeployError) as info:
        second.take_out("h2", "ref", lambda _: None)
    assert info.value.message.startswith("router front: waited 60s to take h2/ref out: 1 worker(s) out already")
    assert (
        "\n" not in info.value.one_line()
        and "`opsctl deploy -i INVENTORY --host h1 --service ref` frees its worker's place" in info.value.one_line()
    )
    assert fake.calls == [f"remove {W1}"] and second._slots["front"].slots.acquire(blocking=False)


def test_a_lease_left_by_a_killed_deploy_is_freed_by_deploying_that_worker_again() -> None:
    """A deploy whose opsctl was killed after its take-out leaves its lease: the next deploy of that worker (it
    holds the host's deploy lock) frees it, unchanged or not, and the other worker's deploy proceeds."""
    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    store = MemoryMembership()
    killed = guard(fake, [0], [0.0])
    killed.kept_out = store
    killed.take_out("h1", "ref", lambda _: None)  # never put back
    fake.members_now.append(Member("a2", W1, True, 0))  # serving again (systemd, or by hand)
    again = guard(fake, [0], [0.0])
    again.kept_out = store
    again.serving = lambda host, service: True  # type: ignore[method-assign]
    said: list[str] = []
    assert again.ensure_in("h1", "ref", said.append) == ""
    assert said == ["router front: freed the place an earlier deploy of this worker held (it did not end)"]
    assert state(store).deploys == ()  # type: ignore[arg-type]
    again.take_out("h2", "ref", lambda _: None)  # not refused, no wait


def test_decide_take_out_rules() -> None:
    lease = LockInfo("t1", "op@m1", 0, "2026-12-05T10:00:00Z", "deploy h1/ref")
    other = LockInfo("t2", "op@elsewhere", 0, "2026-12-05T10:00:00Z", "deploy h2/ref")
    both = [Member("a", W1, True, 0), Member("b", W2, True, 0)]
    take = decide_take_out(Membership(), both, W1, lease, 1)
    assert take.verdict is Verdict.TAKE and take.after == Membership(frozenset({W1}), ((W1, lease),))
    # h2 out for another deploy: wait (one slot), and with two slots wait too (h1 would be the last serving)
    held = Membership(frozenset({W2}), ((W2, other),))
    assert decide_take_out(held, [both[0]], W1, lease, 1).verdict is Verdict.WAIT
    assert decide_take_out(held, [both[0]], W1, lease, 2).verdict is Verdict.WAIT
    # a third worker that serves: with two slots, h1 may go
    w3 = "http://10.0.0.3:30000"
    three = [both[0], Member("c", w3, True, 0)]
    assert decide_take_out(held, three, W1, lease, 2).verdict is Verdict.TAKE
    # h2 left out (not serving) with no deploy running: h1 is the last healthy worker, refused
    left = Membership(frozenset({W2}))
    refused = decide_take_out(left, both, W1, lease, 1)
    assert refused.verdict is Verdict.REFUSE and refused.reason == f"{W1} healthy"
    # a lease on h1 itself is stale (its deploy holds h1's deploy lock): taken over
    mine = Membership(frozenset({W1}), ((W1, other),))
    assert decide_take_out(mine, both, W1, lease, 1).after == Membership(frozenset({W1}), ((W1, lease),))
    # a lease of this machine whose process is gone holds nobody out: dropped (what it kept out stays out)
    import socket

    gone = LockInfo("t3", f"op@{socket.gethostname()}", 2**22 + 12345, "2026-12-05T10:00:00Z", "deploy h2/ref")
    after = decide_take_out(Membership(frozenset({W2}), ((W2, gone),)), three, W1, lease, 1).after
    assert after == Membership(frozenset({W1, W2}), ((W1, lease),))


def test_the_recorder_swaps_only_what_it_read_on_the_host(tmp_path: Path) -> None:
    """The SSH store's commands run for real (a local connection: cat, flock, sha256sum, mv): a swap against a
    version that another writer changed meanwhile writes nothing and says so."""
    from opsctl.remote.local import LocalHost

    inv = inventory()
    router = inv.router("front")
    recorder = KeptOutRecorder(inv, connect=lambda host: LocalHost(), directory=str(tmp_path / "routers"))
    version, empty = recorder.read(router)
    assert empty == Membership()
    lease = LockInfo("tok", "op@m", 7, "2026-12-05T10:00:00Z", "deploy h1/ref")
    assert recorder.swap(router, version, empty.keeping(W1, True).leasing(W1, lease))
    assert not recorder.swap(router, version, empty.keeping(W2, True))  # stale version: refused, unchanged
    path = Path(kept_out_file("front", str(tmp_path / "routers")))
    assert parse_membership(path.read_text()) == Membership(frozenset({W1}), ((W1, lease),))
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    # concurrent changes through `change` lose nothing (the old read-modify-write lost entries)
    urls = [f"http://10.0.1.{i}:30000" for i in range(8)]
    threads = [
        threading.Thread(target=change, args=(recorder, router, lambda m, u=u: m.keeping(u, True))) for u in urls
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert parse_membership(path.read_text()).kept_out == frozenset({W1, *urls})
    recorder.close()
    assert parse_kept_out("") == () and parse_kept_out('{"kept_out": [1]}') == () and parse_kept_out("[") == ()
    assert parse_membership('{"kept_out": [], "deploys": {"u": {"pid": 1}}}') == Membership()


def test_router_status_does_not_fail_on_a_worker_out_for_a_running_deploy() -> None:
    """A worker out for a deploy that still runs (its lease in the membership file) is what a rolling deploy does:
    the router row stays healthy and lists the deploy; the same worker missing without a lease fails it."""
    import os
    import socket

    from opsctl.remote.fake import FakeHost
    from opsctl.router.status import collect_router

    inv = inventory()
    lease = LockInfo("t", f"op@{socket.gethostname()}", os.getpid(), "2026-12-05T10:00:00Z", "deploy h1/ref")
    only_w2 = {"workers": [{"id": "b", "url": W2, "is_healthy": True, "load": 0}]}

    def handler(text: str):  # type: ignore[no-untyped-def]
        def answer(cmd: Any):  # type: ignore[no-untyped-def]
            shown = cmd.display()
            if "kept-out.json" in shown:
                return (0, text, "")
            if shown.startswith("systemctl show"):
                return (0, "ActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n", "")
            return None

        return answer

    def route(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=only_w2) if request.url.path == "/workers" else httpx.Response(200)

    http = httpx.Client(transport=httpx.MockTransport(route))
    leased = Membership(frozenset({W1}), ((W1, lease),)).to_json()
    row = collect_router(FakeHost("h1", handler=handler(leased)), inv, inv.router("front"), http)
    assert row.healthy and row.missing == ["h1/ref"] and row.kept_out == ["h1/ref"]
    (line,) = row.deploys
    assert line.startswith(f"h1/ref (by op@{socket.gethostname()} pid {os.getpid()} (deploy h1/ref) since 2026-12-05T")
    bare = collect_router(FakeHost("h1", handler=handler(kept_out_json([W1]))), inv, inv.router("front"), http)
    assert not bare.healthy and bare.deploys == []


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_LEASE = st.builds(
    LockInfo,
    st.text(min_size=1, max_size=12),
    st.text(max_size=12),
    st.integers(0, 2**31),
    st.text(max_size=20),
    st.text(max_size=20),
)


@settings(max_examples=200, deadline=None)
@given(_JSON)
def test_any_membership_file_parses_to_a_value_and_never_raises(data: Any) -> None:
    """The file is read by every take-out (and by the router's launcher): whatever a hand edit or a half-written
    file holds, it is a Membership (what does not parse is left out), never an exception."""
    for text in (json.dumps(data), json.dumps({"kept_out": data, "deploys": data}), json.dumps(data)[:7]):
        state = parse_membership(text)
        assert isinstance(state, Membership) and all(isinstance(u, str) for u in state.kept_out)


@settings(max_examples=100, deadline=None)
@given(st.frozensets(st.text(max_size=30), max_size=5), st.dictionaries(st.text(max_size=30), _LEASE, max_size=4))
def test_membership_round_trips_through_its_file(kept: frozenset[str], leases: dict[str, LockInfo]) -> None:
    state = Membership(kept, tuple(sorted(leases.items())))
    assert parse_membership(state.to_json()) == state


def test_a_swap_that_always_loses_is_bounded_and_one_line() -> None:
    """A file that changes between every read and write (another opsctl in a loop, or a host that answers other
    bytes than it stores) ends the take-out in one line, nothing switched, instead of looping for ever."""

    class Losing(MemoryMembership):
        def swap(self, router: Any, version: str, after: Membership) -> bool:
            return False

    fake = FakeRouter([Member("a", W1, True, 0), Member("b", W2, True, 0)])
    g = guard(fake, [0], [0.0])
    g.kept_out = Losing()
    with pytest.raises(DeployError) as info:
        g.take_out("h1", "ref", lambda _: None)
    assert (
        info.value.message
        == "router front: its membership file on h1 changed under each of 50 attempts to take h1/ref out"
    )
    assert fake.calls == [] and g._slots["front"].slots.acquire(blocking=False)
