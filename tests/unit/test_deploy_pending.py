"""A release is `current` only after its gates pass: a host that rebooted during the health/smoke
gate left an untested release live; the next deploy called it "unchanged" (and put it back into the router with
no smoke gate), it stayed the rollback target, and `rollback` restored releases with a health check only."""

from __future__ import annotations

import threading
from dataclasses import replace

import httpx

from opsctl.commands import Cmd
from opsctl.deploy import flow, release
from opsctl.deploy.context import ServiceContext
from opsctl.deploy.outcome import Outcome
from opsctl.errors import UnreachableError
from opsctl.remote.fake import FakeHost
from tests.unit.test_rollout_flow import NOW, OLD, SETTINGS, Box, _live_steps, ctx_for  # noqa: F401

FAST = replace(SETTINGS, health_timeout=0.3)


class PendingBox(Box):
    """Box with the pending marker, and a host that goes away right after the restart (a reboot mid-gate)."""

    def __init__(self, current: str | None) -> None:
        super().__init__(current)
        self.pending: set[str] = set()
        self.reboot_at_restart = False
        self.down = False

    def handler(self, cmd: Cmd):  # type: ignore[no-untyped-def]
        text = cmd.display()
        if self.down:
            return UnreachableError("ref-host", "connection refused")
        if release.PENDING_MARKER in text and text.startswith(("touch", "rm -f")):
            rid = text.split("releases/")[1].split("/")[0]
            (self.pending.add if text.startswith("touch") else self.pending.discard)(rid)
            return (0, "", "")
        if "readlink" in text:  # release.facts_cmd
            lines = [f"current /opt/opsctl/services/ref-shadow/releases/{self.current}" if self.current else "current "]
            lines += [f"release {r} {int(r in self.bad)} 1 {int(r in self.pending)}" for r in sorted(self.releases)]
            return (0, "\n".join(lines) + "\n", "")
        answer = super().handler(cmd)
        if text.startswith("systemctl restart") and self.reboot_at_restart:
            self.down = True
        return answer


def _interrupted_first_deploy(make, wheel, box: PendingBox, **kw):  # type: ignore[no-untyped-def]
    box.reboot_at_restart = True
    ctx, _ = make(box, **kw)
    first = flow.deploy_service(ctx, wheel, FAST)
    assert first.outcome is Outcome.UNREACHABLE, first.message
    assert box.current == first.release and box.pending == {first.release}  # live, untested
    box.reboot_at_restart = box.down = False  # the host is back
    return first


def test_the_next_deploy_finishes_an_interrupted_gate_instead_of_calling_it_unchanged(ctx_for) -> None:  # noqa: F811
    make, wheel, said = ctx_for
    box = PendingBox(None)
    first = _interrupted_first_deploy(make, wheel, box)
    ctx, fake = make(box)
    again = flow.deploy_service(ctx, wheel, FAST)
    assert again.outcome is Outcome.DEPLOYED and again.release == first.release, again.message
    assert again.message.startswith(f"{first.release}: gates finished (interrupted before), healthy after")
    assert box.pending == set() and _live_steps(fake) == []  # tested where it runs: nothing restarted
    assert any("never finished its gates: running them now" in line for line in said)
    assert any(line.startswith("smoke ok") for line in said)


def test_an_interrupted_release_that_fails_its_gates_is_rolled_back_and_is_no_rollback_target(ctx_for) -> None:  # noqa: F811
    make, wheel, _ = ctx_for
    box = PendingBox(OLD)
    first = _interrupted_first_deploy(make, wheel, box, health_ok=lambda: box.current == OLD)
    facts = release.parse_release_facts(box.handler(release.facts_cmd(release.ServicePaths("ref-shadow")))[1])
    assert facts.current_pending and facts.rollback_target() == OLD
    assert release.ReleaseFacts(OLD, (release.ReleaseEntry(first.release, False, True, True),
                                      release.ReleaseEntry(OLD, False, True))).rollback_target() is None  # fmt: skip
    ctx, _ = make(box, health_ok=lambda: box.current == OLD)
    again = flow.deploy_service(ctx, wheel, FAST)
    assert again.outcome is Outcome.ROLLED_BACK, again.message
    assert box.current == OLD and first.release in box.bad
    assert "never finished its gates, and fails them now" in again.message


def test_rollback_runs_the_smoke_gate(ctx_for) -> None:  # noqa: F811
    make, _, _ = ctx_for
    new = "20261129T210000Z-bbbbbbbbbbbb"
    box = PendingBox(new)
    box.releases[OLD] = 0
    ctx, fake = make(box)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny"}]})
        if box.current == OLD:  # OLD answers /health but not a chat request
            return httpx.Response(500, json={"error": {"message": "CUDA error: an illegal memory access"}})
        return httpx.Response(200, json={"choices": [{"message": {"content": "4"}, "finish_reason": "stop"}],
                                         "usage": {"completion_tokens": 1}})  # fmt: skip

    ctx = ServiceContext(ctx.host, ctx.service, fake, httpx.Client(transport=httpx.MockTransport(handle)),
                         threading.Event(), lambda _l: None, now=NOW)  # fmt: skip
    result = flow.rollback_service(ctx, replace(FAST, allow_old_secrets=True))
    assert result.outcome is Outcome.FAILED and "smoke gate failed" in result.message, result.message
    assert box.current == new and OLD in box.bad  # the release that served is back; OLD no target any more


def test_facts_read_the_marker_and_older_hosts_have_none() -> None:
    out = f"current /x/releases/{OLD}\nrelease {OLD} 0 1 1\n"
    assert release.parse_release_facts(out).current_pending
    old_format = f"current /x/releases/{OLD}\nrelease {OLD} 0 1\n"  # an opsctl from before the marker
    assert not release.parse_release_facts(old_format).current_pending


def test_status_fails_while_the_current_release_never_passed_its_gates(monkeypatch) -> None:
    from pathlib import Path

    from opsctl import status
    from opsctl.inventory.load import load_inventory

    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    host = load_inventory(Path(__file__).parent / "golden" / "inventory.yaml").hosts[0]

    def handler(cmd: Cmd):  # type: ignore[no-untyped-def]
        text = cmd.display()
        if "readlink" in text:
            return (0, f"current /opt/opsctl/services/ref-shadow/releases/{OLD}\nrelease {OLD} 0 1 1\n", "")
        if text.startswith("systemctl show"):
            return (0, "ActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n", "")
        return None

    http = httpx.Client(transport=httpx.MockTransport(lambda _r: httpx.Response(200)))
    row = status.collect(FakeHost(host.name, handler=handler), host, host.service("ref-shadow"), http)
    assert row.healthy and row.gates_pending and row.failing  # /health answers, and still it was never tested


def test_status_during_a_deploy_in_progress_says_so_and_does_not_fail(monkeypatch) -> None:
    """Before, `status` while a deploy ran its gates called the release "interrupted" and exited 1 (cron and CI
    checks went red). While the host's deploy lock is held by a live deploy, a release in its gates and a
    restarting service are that deploy's doing: one line says so, exit 0. A stale lock (its process gone) or
    no lock: failing, as before."""
    import os
    import socket
    from pathlib import Path

    from opsctl import status
    from opsctl.cli.common import console
    from opsctl.cli.status import _table
    from opsctl.inventory.load import load_inventory

    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    host = load_inventory(Path(__file__).parent / "golden" / "inventory.yaml").hosts[0]

    def handler_for(pid: int | None):  # type: ignore[no-untyped-def]
        def handler(cmd: Cmd):  # type: ignore[no-untyped-def]
            text = cmd.display()
            if "readlink" in text:
                return (0, f"current /opt/opsctl/services/ref-shadow/releases/{OLD}\nrelease {OLD} 0 1 1\n", "")
            if text.startswith("systemctl show"):
                return (0, "ActiveState=activating\nSubState=start\nResult=success\nNRestarts=0\n", "")
            if "deploy.lock/holder" in text and pid is not None:
                holder = f"root@{socket.gethostname()}"
                return (0, f"token=t\nholder={holder}\npid={pid}\nsince=2026-12-05T10:00:00Z\naction=deploy x\n", "")
            return None

        return handler

    http = httpx.Client(transport=httpx.MockTransport(lambda _r: httpx.Response(503)))
    live = status.collect(FakeHost(host.name, handler=handler_for(os.getpid())), host, host.service("ref-shadow"), http)
    assert live.deploying and live.gates_pending and not live.healthy and not live.failing
    with console.capture() as out:
        _table([live])
    text = " ".join(out.get().split())
    assert f"a deploy is in progress (release {OLD} is going through its gates; deploy lock held by root@" in text
    assert "interrupted" not in text
    for pid in (None, 2**22 + 4321):  # no lock; a lock whose process is gone (stale)
        row = status.collect(FakeHost(host.name, handler=handler_for(pid)), host, host.service("ref-shadow"), http)
        assert not row.deploying and row.failing


class MarkedBox(PendingBox):
    """PendingBox whose BAD markers can also be read and removed (rollback --to a BAD release with --force)."""

    def handler(self, cmd: Cmd):  # type: ignore[no-untyped-def]
        text = cmd.display()
        if text.endswith(f"/{release.BAD_MARKER}") and text.startswith(("cat", "rm -f")):
            rid = text.split("releases/")[1].split("/")[0]
            if text.startswith("cat"):
                return (0, "health gate failed: /health: connection refused\n", "") if rid in self.bad else (1, "", "")
            self.bad.discard(rid)
            return (0, "", "")
        return super().handler(cmd)


def _two_releases(make, target_state: str):  # type: ignore[no-untyped-def]
    new = "20261129T210000Z-bbbbbbbbbbbb"
    box = MarkedBox(new)
    box.releases[OLD] = 0
    (box.pending if target_state == "pending" else box.bad).add(OLD)
    ctx, fake = make(box)
    return box, ctx, fake, new


def test_rollback_to_a_release_that_never_finished_its_gates_warns_runs_them_and_clears_the_mark(ctx_for) -> None:  # noqa: F811
    make, _, said = ctx_for
    box, ctx, _, _ = _two_releases(make, "pending")
    planned = flow.rollback_service(ctx, replace(FAST, allow_old_secrets=True, plan=True), to=OLD)
    assert planned.outcome is Outcome.PLANNED and "never passed its gates: they run first" in planned.message
    result = flow.rollback_service(ctx, replace(FAST, allow_old_secrets=True), to=OLD)
    assert result.outcome is Outcome.REVERTED, result.message
    assert result.message.endswith("it passed its gates now (no longer untested or BAD)")
    assert any(line.startswith("WARNING ") and f"{OLD} went live once but never finished its gates" in line
               for line in said)  # fmt: skip
    assert any(line.startswith("smoke ok") for line in said)  # the gates ran
    assert box.current == OLD and box.pending == set()


def test_rollback_to_a_bad_release_is_refused_without_force(ctx_for) -> None:  # noqa: F811
    from opsctl.errors import DeployError

    make, _, said = ctx_for
    box, ctx, fake, new = _two_releases(make, "bad")
    try:
        flow.rollback_service(ctx, replace(FAST, allow_old_secrets=True), to=OLD)
        raise AssertionError("a BAD target was not refused")
    except DeployError as err:
        line = err.one_line()
    assert f"release {OLD} is marked BAD (health gate failed: /health: connection refused); nothing was changed" in line
    assert "add --force to go back to it anyway" in line
    assert box.current == new and _live_steps(fake) == []
    forced = flow.rollback_service(ctx, replace(FAST, allow_old_secrets=True, force=True), to=OLD)
    assert forced.outcome is Outcome.REVERTED and box.current == OLD and OLD not in box.bad, forced.message
    assert any("is marked BAD; --force: rolling back to it, gates first" in line for line in said)
