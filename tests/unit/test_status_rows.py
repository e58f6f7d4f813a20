"""`opsctl status` rows from a FakeHost: what makes status exit non-zero (a STALE lock blocks every
deploy, so status must not say all is well)."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from opsctl import status
from opsctl.commands import Cmd
from opsctl.deploy import lock
from opsctl.inventory.load import load_inventory
from opsctl.remote.fake import FakeHost

GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"
DEAD_PID = 2**22 + 4321  # above the default pid_max: no such process


def _row(holder: str) -> status.ServiceStatus:
    inv = load_inventory(GOLDEN)
    host = inv.hosts[0]

    def handler(cmd: Cmd):
        if cmd.display() == lock.read_cmd().display():
            return (0, holder, "")
        if cmd.display().startswith("systemctl show"):
            return (0, "ActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n", "")
        return None

    http = httpx.Client(transport=httpx.MockTransport(lambda _r: httpx.Response(200)))
    return status.collect(FakeHost(host.name, handler=handler), host, host.service("ref-shadow"), http)


@pytest.mark.parametrize(
    ("machine", "stale"), [(socket.gethostname(), True), ("other-machine", False)], ids=["here-dead", "elsewhere"]
)
def test_a_stale_lock_fails_status(monkeypatch: pytest.MonkeyPatch, machine: str, stale: bool) -> None:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    holder = f"token=0000\nholder=root@{machine}\npid={DEAD_PID}\nsince=2026-01-01T00:00:00Z\naction=deploy ref\n"
    row = _row(holder)
    assert row.healthy and row.lock is not None
    assert row.lock_stale is stale and row.failing is stale


def test_no_lock_no_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    row = _row("")
    assert row.lock is None and not row.lock_stale and not row.failing
