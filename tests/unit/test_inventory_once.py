"""Validation done once per distinct value (the 1,100-host inventory): a section read from
`defaults:` alone is parsed for the first host and shared, and a valid (text, kind) is checked once. Only
passes are remembered, so every refusal reads as before."""

from __future__ import annotations

from typing import Any

import pytest

from opsctl.errors import InventoryError
from opsctl.inventory import rules
from opsctl.inventory.load import parse_inventory
from opsctl.inventory.rules import Kind

SERVICE = {"gpus": [0], "port": 30000, "mode": "baseline", "model": {"source": "/data/m", "path": "/dev/shm/m"}}
CUDA = {"toolkit_package": "cuda-toolkit-13-0", "home": "/usr/local/cuda-13.0", "driver_package": "nvidia-open"}


def _hosts(n: int, **own: dict[str, Any]) -> dict[str, Any]:
    hosts = {f"h{i}": {"address": f"10.0.0.{i + 1}", "gpus": 1, "services": {"gpu0": SERVICE}} for i in range(n)}
    for name, extra in own.items():
        hosts[name] = {**hosts[name], **extra}
    return hosts


def test_a_section_from_defaults_is_read_once_and_shared() -> None:
    defaults = {"ssh": {"user": "ops", "port": 2222}, "cuda": CUDA}
    inv = parse_inventory({"defaults": defaults, "hosts": _hosts(3)})
    assert inv.hosts[0].ssh.user == "ops" and inv.hosts[0].ssh.port == 2222
    assert inv.hosts[0].ssh is inv.hosts[2].ssh and inv.hosts[0].cuda is inv.hosts[2].cuda


def test_a_host_with_its_own_section_is_read_on_its_own() -> None:
    defaults = {"ssh": {"user": "ops"}, "cuda": CUDA}
    inv = parse_inventory({"defaults": defaults, "hosts": _hosts(3, h2={"ssh": {"port": 2200}})})
    assert [h.ssh.port for h in inv.hosts] == [22, 22, 2200] and inv.hosts[2].ssh.user == "ops"
    with pytest.raises(InventoryError) as err:  # a later host's own bad value is still refused, by its path
        parse_inventory({"defaults": defaults, "hosts": _hosts(3, h2={"cuda": {"driver_package": "bad;pkg"}})})
    assert err.value.path == "hosts.h2.cuda.driver_package"


def test_a_valid_value_checked_before_changes_no_refusal() -> None:
    assert rules.check("/opt/a", Kind.HOST_PATH, "x") == "/opt/a"
    assert ("/opt/a", Kind.HOST_PATH) in rules._VALID
    with pytest.raises(InventoryError) as first:
        rules.check("/opt/../a", Kind.HOST_PATH, "hosts.h.venv")
    with pytest.raises(InventoryError) as again:  # refusals are never remembered: the same message each time
        rules.check("/opt/../a", Kind.HOST_PATH, "hosts.h.venv")
    assert first.value.one_line() == again.value.one_line() and "must not contain '..'" in first.value.one_line()
    with pytest.raises(InventoryError):  # valid as one kind is not valid as another
        rules.check("/opt/a", Kind.NAME, "hosts.h.services")
