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
from tests.lab import lab_parts

LAB_HOSTS = 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """OPSCTL_LAB_PART=1|2: this pytest runs only its part's lab modules (tests/lab/lab_parts.py)."""
    try:
        lab_parts.part()
    except lab_parts.LabEnvError as exc:
        raise pytest.UsageError(str(exc)) from None
    here = Path(__file__).parent
    keep, drop = [], []
    for item in items:
        path = item.path
        mine = path.parent != here or lab_parts.in_part(path.name)
        (keep if mine else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


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
    """A lab of this pytest's own (tests/lab/lab_parts.py): OPSCTL_LAB_SLOT=N (1-9) for a second checkout that
    runs this tier at once, OPSCTL_LAB_PART=1|2 for the two halves of the tier that scripts/check runs at once."""
    try:
        return lab_parts.lab_config()
    except lab_parts.LabEnvError as exc:
        raise pytest.UsageError(str(exc)) from None


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
