"""Lab tier fixtures: one lab of 2 hosts per test session (reused if already running).

`lab_hosts` brings up lab1 and lab2 (a running lab is reused) and, at the end of the session, removes only
what it brought up. A lab left stopped on disk (a machine restarted mid-run, a killed session) is removed
first: its hosts carry releases and half-finished states of some earlier run, and the tests start clean.
`lab_inventory` is the inventory that `lab up` wrote, loaded by the real loader.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.inventory.load import load_inventory
from opsctl.inventory.model import Inventory
from opsctl.lab import LabConfig, LabReport, down, remove_host, status, up
from opsctl.remote import SshHost, connect

REPO = Path(__file__).resolve().parents[2]
LAB_HOSTS = 2


@pytest.fixture(scope="session", autouse=True)
def _own_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's control-machine state (audit logs, the copies of the hosts' model records) in its own
    dir, inherited by every opsctl the tests start: a lab rebuilt with the same names and addresses is never
    judged against a record kept by an earlier session."""
    state = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_STATE_HOME", str(state))
        yield state


@pytest.fixture(scope="session")
def lab_config() -> LabConfig:
    """OPSCTL_LAB_SLOT=N (1-9): a lab of its own (names, subnet, dirs), so two checkouts can run this tier at once."""
    config = LabConfig(inventory_path=REPO / "inventory" / "lab.yaml")
    slot = os.environ.get("OPSCTL_LAB_SLOT", "")
    if not slot:
        return config
    if slot not in {str(n) for n in range(1, 10)}:
        raise pytest.UsageError(f"OPSCTL_LAB_SLOT must be one digit 1-9, got {slot[:20]!r}")
    return dataclasses.replace(
        config,
        subnet=ipaddress.IPv4Network(f"10.{220 + int(slot)}.0.0/24"),
        root_dir=config.root_dir.with_name(f"lab-{slot}"),
        state_dir=config.state_dir.with_name(f"opsctl-lab-{slot}"),
        prefix=f"olab{slot}",
    )


@pytest.fixture(scope="session")
def lab_hosts(lab_config: LabConfig) -> Iterator[LabReport]:
    if os.geteuid() != 0:
        pytest.skip("the lab tier needs root (network namespaces, mounts, systemd-nspawn)")
    before = status(lab_config)
    if any(h.state != "running" for h in before.hosts):
        down(lab_config)
        before = status(lab_config)
    had = {h.name for h in before.hosts}
    report = up(lab_config, LAB_HOSTS)
    try:
        yield report
    finally:
        if not had:
            down(lab_config)
        else:
            for name in sorted({h.name for h in status(lab_config).hosts} - had):
                remove_host(lab_config, name)


@pytest.fixture(scope="session")
def lab_inventory(lab_hosts: LabReport) -> Inventory:
    return load_inventory(lab_hosts.inventory)


@pytest.fixture
def remotes(lab_inventory: Inventory) -> Iterator[dict[str, SshHost]]:
    """One SSH connection per lab host (through opsctl.remote), closed after the test."""
    hosts = {h.name: connect(h) for h in lab_inventory.hosts}
    try:
        yield hosts
    finally:
        for host in hosts.values():
            host.close()
