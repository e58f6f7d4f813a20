"""The router's own deploy against a FakeHost (commands asserted exactly where they matter) and a mocked HTTP
side: a first deploy stages, installs offline, checks the flags against sglang-router 0.3.2's recorded --help,
verifies, switches and gates; the key is only ever in the 0600 router.json; an unchanged router is never
restarted; a router that never answers is rolled back."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from opsctl.commands import Cmd
from opsctl.deploy.outcome import Outcome
from opsctl.errors import UnreachableError
from opsctl.inventory.model import Inventory
from opsctl.kernel.gate import GateConfig, GateResult
from opsctl.remote.fake import FakeHost
from opsctl.router import deploy as router_deploy
from opsctl.router.deploy import RouterDeploy
from tests.unit.router_fleet import ONE_REF, fleet

HELP = (Path(__file__).parents[1] / "fixtures" / "router" / "launch_router_help-0.3.2.txt").read_text()
SECRET = "s3cret-router-deploy-key"
ROOT = "/opt/opsctl/services/router-front"


def inventory(**router: Any) -> Inventory:
    wheelhouse = {"wheelhouse": "/var/cache/opsctl/wheelhouse"}
    return fleet(ONE_REF, defaults=wheelhouse, **{"api_key": "env:RK", "readiness_delay": 0, **router})


class Host(FakeHost):
    """Answers like a host: release facts from what was written, systemctl show, the router's --help."""

    def __init__(self, current: str | None = None, restarts: list[int] | None = None) -> None:
        super().__init__("h1", handler=self.answer)
        self.current = current
        self.restarts = restarts or [0]

    def answer(self, cmd: Cmd) -> Any:
        shown = cmd.display()
        if "readlink" in shown and f"{ROOT}/current" in shown:
            rel = f"release {self.current} 0 1\n" if self.current else ""
            return (0, f"current {ROOT}/releases/{self.current or ''}\nprevious \n{rel}", "")
        if "launch_router --help" in shown:
            return (0, HELP, "")
        if shown.startswith("systemctl show"):
            n = self.restarts.pop(0) if len(self.restarts) > 1 else self.restarts[0]
            return (0, f"ActiveState=active\nSubState=running\nNRestarts={n}\n", "")
        if "mv -T" in shown and "current.tmp" in shown:
            self.current = re.search(r"releases/(\S+?) ", shown).group(1)  # type: ignore[union-attr]
        return None


def http(router_up: bool) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "10.0.0.1" and request.url.port == 30080 and router_up:
            return httpx.Response(200)
        raise httpx.ConnectError("connection refused")

    return httpx.Client(transport=httpx.MockTransport(handler))


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RK", SECRET)


def test_first_deploy_stages_installs_offline_and_gates() -> None:
    inv = inventory()
    host = Host()
    said: list[str] = []
    result = RouterDeploy(inv, inv.router("front"), host, http(True), said.append).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.DEPLOYED, result.message
    rid = result.release
    assert rid is not None
    site = f"{ROOT}/releases/{rid}/site"
    assert (
        f"/opt/opsctl/venv/bin/python -m pip install --quiet --disable-pip-version-check --no-index "
        f"--find-links /var/cache/opsctl/router-wheelhouse --target {site} -r {ROOT}/releases/{rid}/requirements.txt"
    ) in host.ran
    restart = host.ran.index("systemctl restart -- opsctl-router-front.service")
    assert host.ran[restart - 3 : restart] == [
        "install -m 0644 "
        f"{ROOT}/releases/{rid}/opsctl-router-front.service /etc/systemd/system/opsctl-router-front.service",
        "systemctl daemon-reload",
        "systemctl enable --quiet -- opsctl-router-front.service",
    ]
    config, mode = host.files[f"{ROOT}/releases/{rid}/router.json"]
    assert mode == 0o600 and SECRET in config
    leaked = [p for p, (text, _) in host.files.items() if SECRET in text and not p.endswith("router.json")]
    assert leaked == [] and not any(SECRET in line for line in host.ran + said)
    assert f"{ROOT}/releases/{rid}/manifest.json" in host.files


def test_unchanged_router_is_not_restarted() -> None:
    inv = inventory()
    first = Host()
    rid = RouterDeploy(inv, inv.router("front"), first, http(True)).deploy().release  # type: ignore[arg-type]
    again = Host(current=rid)
    result = RouterDeploy(inv, inv.router("front"), again, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.UNCHANGED and not any("restart" in line for line in again.ran)


def test_router_that_never_answers_fails_its_gate_and_is_stopped_without_a_previous() -> None:
    inv = inventory()
    router = inv.router("front")
    router = type(router)(**{**router.__dict__, "health_timeout": 1.0})
    host = Host()
    result = RouterDeploy(inv, router, host, http(False)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.FAILED
    assert "no HTTP 200 from /health within 1s" in result.message and "router stopped" in result.message
    assert "systemctl disable --now --quiet -- opsctl-router-front.service" in host.ran


def test_failed_router_release_is_restored_through_the_corridor_with_reset_failed() -> None:
    """The router's rollback runs the services' restore: reset-failed first (the copies used to differ)."""
    inv = inventory()
    rid = RouterDeploy(inv, inv.router("front"), Host(), http(True)).deploy().release  # type: ignore[arg-type]
    changed = inventory(policy="random")
    host = Host(current=rid, restarts=[0, 1])  # the new release crash-loops: NRestarts moves in its gate
    result = RouterDeploy(changed, changed.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    reset = host.ran.index("systemctl reset-failed -- opsctl-router-front.service")
    assert host.ran[reset + 1].startswith(f"sh -c 'ln -sfn releases/{rid} ")
    assert host.ran[reset + 5] == "systemctl restart -- opsctl-router-front.service"


class GoneAfterGoLive(Host):
    """The new release goes live and fails; the host stops answering before the old one is restored."""

    def answer(self, cmd: Cmd) -> Any:
        if "reset-failed" in cmd.display():
            return UnreachableError("h1", "connection lost")
        return super().answer(cmd)


def test_a_host_lost_while_restoring_is_unreachable_not_a_failed_rollback() -> None:
    """The corridor's roll-back-after-failure, shared with the services (the router's copy reported FAILED)."""
    inv = inventory()
    rid = RouterDeploy(inv, inv.router("front"), Host(), http(True)).deploy().release  # type: ignore[arg-type]
    changed = inventory(policy="random")
    host = GoneAfterGoLive(current=rid, restarts=[0, 1])
    result = RouterDeploy(changed, changed.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.UNREACHABLE, result.message
    assert "rollback impossible: h1: unreachable: connection lost" in result.message
    assert any("BAD" in line and result.release in line for line in host.ran)  # marked bad before the restore


def test_the_restored_router_is_re_checked_with_a_short_readiness_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a service's: the release that comes back served before (the router's copy waited the whole delay)."""
    delays: list[float] = []
    results = iter([False, True])

    def gate(*_: Any, config: GateConfig, **__: Any) -> GateResult:
        delays.append(config.readiness_delay)
        ok = next(results)
        return GateResult(ok, "healthy" if ok else "crash-looping", 0.1 if ok else None, None, None)

    monkeypatch.setattr(router_deploy, "health_gate", gate)
    inv = inventory(readiness_delay=30)
    host = Host(current="20261201T000000Z-0123456789ab")
    result = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy(force=True)  # type: ignore[arg-type]
    assert result.outcome is Outcome.ROLLED_BACK, result.message
    assert delays == [30, 5.0]


def test_rollback_whose_target_fails_marks_it_bad_and_restores_through_the_corridor() -> None:
    inv = inventory()
    old = "20261201T000000Z-0123456789ab"
    host = Host(current="20261202T000000Z-ba9876543210", restarts=[0, 1, 1])

    def facts(cmd: Cmd) -> Any:
        if "readlink" in cmd.display():
            cur = host.current
            return (0, f"current {ROOT}/releases/{cur}\nprevious \nrelease {old} 0 1\nrelease {cur} 0 1\n", "")
        return Host.answer(host, cmd)

    host.handler = facts
    said: list[str] = []
    result = RouterDeploy(inv, inv.router("front"), host, http(True), said.append).rollback(to=old)  # type: ignore[arg-type]
    assert result.outcome is Outcome.FAILED and result.release == old
    assert (
        result.message.startswith(f"{old} failed its health gate (")
        and "20261202T000000Z-ba9876543210 restored" in result.message
    )
    assert any("BAD" in line and old in line for line in host.ran)
    assert said[0] == f"rolling back 20261202T000000Z-ba9876543210 -> {old}"


def test_unchanged_router_still_starting_gets_the_gates_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a service's: a router whose unit is still starting (right after a reboot) is waited for, not failed."""
    inv = inventory()
    rid = RouterDeploy(inv, inv.router("front"), Host(), http(True)).deploy().release  # type: ignore[arg-type]
    monkeypatch.setattr(
        router_deploy, "health_gate", lambda *a, config, **k: GateResult(True, "healthy", 2.5, None, None)
    )
    again, said = Host(current=rid), []
    result = RouterDeploy(inv, inv.router("front"), again, http(False), said.append).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.UNCHANGED, result.message
    assert result.message == f"release {rid}: same config, nothing restarted (was still starting; healthy after 2.5s)"
    assert not any("systemctl restart" in line for line in again.ran)
    assert len(said) == 1 and said[0].startswith("unchanged config; opsctl-router-front.service is active/running")
    assert said[0].endswith("but /health does not answer yet: waiting")


class Stopped(Host):
    """A router unit stopped with `systemctl stop` until something restarts it."""

    def __init__(self, current: str | None = None) -> None:
        super().__init__(current)
        self.active = False

    def answer(self, cmd: Cmd) -> Any:
        shown = cmd.display()
        if shown.startswith("systemctl restart"):
            self.active = True
        if shown.startswith("systemctl show") and not self.active:
            return (0, "ActiveState=inactive\nSubState=dead\nResult=success\nNRestarts=0\n", "")
        return super().answer(cmd)


def test_a_stopped_unchanged_router_is_started_again_and_gated(monkeypatch: pytest.MonkeyPatch) -> None:
    """`systemctl stop` of the router, then `opsctl deploy --router front` (the runbook's fix): before, "unchanged
    config ... connection refused" and a hint (`opsctl deploy --force`) that left the router down. Now its current
    release goes live again through the restore steps and is gated; when that fails, the hints name the router."""
    inv = inventory()
    rid = RouterDeploy(inv, inv.router("front"), Host(), http(True)).deploy().release  # type: ignore[arg-type]
    gates: list[GateConfig] = []

    def gate(*a: Any, config: GateConfig, **k: Any) -> GateResult:
        gates.append(config)
        return GateResult(True, "healthy", 1.5, None, None)

    monkeypatch.setattr(router_deploy, "health_gate", gate)
    stopped, said = Stopped(current=rid), []
    result = RouterDeploy(inv, inv.router("front"), stopped, http(False), said.append).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.UNCHANGED and result.release == rid, result.message
    assert result.message == f"release {rid}: same config; it was stopped: started again, healthy after 1.5s"
    assert said == [
        f"unchanged config; opsctl-router-front.service is inactive/dead (result success, NRestarts 0): starting "
        f"release {rid}"
    ]
    ran = [line for line in stopped.ran if line.startswith("systemctl") and "show" not in line]
    assert ran[0].startswith("systemctl reset-failed") and ran[-1].startswith("systemctl restart"), ran
    assert len(gates) == 1
    # the gate fails: exit 1, and every hint is a command that does what it says, for this router
    monkeypatch.setattr(
        router_deploy, "health_gate", lambda *a, **k: GateResult(False, "unit failed", None, None, None)
    )
    failed = RouterDeploy(inv, inv.router("front"), Stopped(current=rid), http(False)).deploy()  # type: ignore[arg-type]
    assert failed.outcome is Outcome.FAILED
    assert failed.message == (
        f"unchanged config (release {rid}) but /health: connection refused; started again: unit "
        "failed; `opsctl logs -i INVENTORY --router front` shows why; `opsctl deploy -i INVENTORY --router front "
        "--force` deploys it as a new release"
    )


class DiskFull(Host):
    def answer(self, cmd: Cmd) -> Any:
        if "pip install" in cmd.display():
            return (1, "", "ERROR: Could not install packages: OSError: [Errno 28] No space left on device")
        return super().answer(cmd)


def test_a_disk_that_fills_while_staging_removes_the_partial_router_release() -> None:
    """As a service's: not even a BAD marker fits, and the half-written release only holds space."""
    inv = inventory()
    host = DiskFull()
    result = RouterDeploy(inv, inv.router("front"), host, http(True)).deploy()  # type: ignore[arg-type]
    assert result.outcome is Outcome.FAILED and result.release is not None
    assert result.message.startswith("staging failed, nothing switched: ")
    assert f"the partial release {result.release} was removed" in result.message
    assert "free space under /opt/opsctl" in result.message
    assert f"rm -rf -- {ROOT}/releases/{result.release}" in host.ran
    marked = [line for line in host.ran if "/BAD" in line and result.release in line]
    assert marked == [] and not any("systemctl restart" in line for line in host.ran)
