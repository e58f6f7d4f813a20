"""Routers the inventory no longer names (one removed from the inventory kept running and vanished
from `status`, with no way to remove it): found on the host, shown by status, removed by `opsctl router
remove` against a FakeHost (the exact commands, in order, under the host's lock, audited)."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl.commands import Cmd
from opsctl.errors import DeployError
from opsctl.inventory.model import Inventory
from opsctl.remote.fake import FakeHost
from opsctl.router import remove
from tests.conftest import run_cli
from tests.unit.router_fleet import ONE_REF, fleet

LISTED = "router-front\nrouter-old\nrouter-$(x)\nref\n"


def _inventory(with_front: bool = True) -> Inventory:
    return fleet(ONE_REF, router=with_front, readiness_delay=0)


def _host() -> FakeHost:
    def handler(cmd: Cmd):
        text = cmd.display()
        if text == remove.installed_cmd().display():
            return (0, LISTED, "")
        if text.startswith("systemctl show"):
            return (0, "ActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n", "")
        if "deploy.lock" in text and "mkdir" in text:
            return (0, "acquired\n", "")
        return None

    return FakeHost("h1", handler=handler)


def test_orphans_are_the_installed_routers_the_inventory_does_not_place_there() -> None:
    assert remove.parse_installed(LISTED) == ["front", "old"]
    assert remove.orphans_of(_inventory(), "h1", ["front", "old"]) == ["old"]
    assert remove.orphans_of(_inventory(), "h2", ["front"]) == ["front"]  # named, but for another host
    found = remove.find_orphans(_host(), _inventory(), _inventory().host("h1"))
    assert found == [remove.Orphan("h1", "old", "active/running")]
    assert "opsctl router remove old --host h1" in found[0].hint()


def test_remove_runs_the_teardown_in_order_under_the_lock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    inv, fake = _inventory(), _host()
    result = remove.remove(fake, inv, inv.host("h1"), "old", plan=False, say=lambda _m: None)
    assert result.removed
    ours = ("router-old", "canary/old")
    teardown = [c for c in fake.ran if any(o in c for o in ours) and "audit" not in c and "show" not in c]
    assert teardown == [
        "systemctl disable --now --quiet -- opsctl-router-old.service",
        "rm -f -- /etc/systemd/system/opsctl-router-old.service",
        "rm -rf -- /opt/opsctl/services/router-old",
        "rm -f -- /var/lib/opsctl/canary/old.json",  # its last canary's state, shown by status until now
        "sh -c 'systemctl reset-failed -- opsctl-router-old.service 2>/dev/null || true'",
    ]
    lock = [i for i, c in enumerate(fake.ran) if "deploy.lock" in c]
    first = fake.ran.index(teardown[0])
    assert lock and lock[0] < first < lock[-1]  # taken before, released after
    assert any("action=router-remove" in c and "result=ok" in c for c in fake.ran)


def test_plan_changes_nothing_and_shows_the_commands() -> None:
    inv, fake = _inventory(), _host()
    result = remove.remove(fake, inv, inv.host("h1"), "old", plan=True, say=lambda _m: None)
    assert not result.removed and result.plan[0] == "systemctl disable --now --quiet -- opsctl-router-old.service"
    assert fake.ran == [remove.installed_cmd().display()]


def test_a_router_still_in_the_inventory_is_refused() -> None:
    inv, fake = _inventory(), _host()
    with pytest.raises(DeployError, match="still in the inventory"):
        remove.remove(fake, inv, inv.host("h1"), "front", plan=False, say=lambda _m: None)
    assert fake.ran == []


def test_an_absent_router_is_nothing_to_do() -> None:
    inv, fake = _inventory(False), _host()
    result = remove.remove(fake, inv, inv.host("h1"), "gone", plan=False, say=lambda _m: None)
    assert not result.removed and "nothing to do" in result.message


@pytest.mark.parametrize("name", ["Front", "a b", "x" * 41, "../etc", "", "a;rm -rf /"])
def test_the_name_argument_is_validated_whole(tmp_path: Path, name: str) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text('{"hosts": {"h1": {"address": "10.0.0.1", "services": {}}}}')
    out = run_cli("router", "remove", name, "--host", "h1", "-i", str(inv))
    assert out.exit_code == 1 and "NAME" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_an_unknown_host_is_one_line(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text('{"hosts": {"h1": {"address": "10.0.0.1", "services": {}}}}')
    out = run_cli("router", "remove", "old", "--host", "h9", "-i", str(inv))
    assert out.exit_code == 1 and "--host h9: no such host" in out.stderr


def test_status_collects_orphans_per_host_and_closes_its_connections() -> None:
    inv, fakes = _inventory(), []

    def connect(host):
        fakes.append(_host())
        return fakes[-1]

    assert remove.collect_orphans(inv, list(inv.hosts), connect) == [remove.Orphan("h1", "old", "active/running")]
    assert len(fakes) == 1 and fakes[0].closed
