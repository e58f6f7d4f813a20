"""Lab tier fixtures: one lab of 2 hosts per test session (reused if already running).

`lab_hosts` brings up lab1 and lab2 (a running lab is reused) and, at the end of the session, removes only
what it brought up. A lab left stopped on disk (a machine restarted mid-run, a killed session) is removed
first: its hosts carry releases and half-finished states of some earlier run, and the tests start clean.
`lab_inventory` is the inventory that `lab up` wrote, loaded by the real loader.
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def lab_config() -> LabConfig:
    return LabConfig(inventory_path=REPO / "inventory" / "lab.yaml")


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
