"""The monitoring tests' inventory: router_fleet's hosts, h1/a in tree mode, h2/a in shadow, and `monitoring:`."""

from __future__ import annotations

from typing import Any

from opsctl.inventory.load import parse_inventory
from opsctl.inventory.model import Inventory
from tests.unit.router_fleet import fleet_data

DRAFT = {"source": "/data/d", "source_on": "host", "path": "/dev/shm/d", "hybrid": False}


def monitor_data(monitoring: dict[str, Any] | None = None) -> dict[str, Any]:
    data = fleet_data()
    data["hosts"]["h1"]["services"]["a"].update(mode="tree", draft_model=dict(DRAFT), served_model_name="tiny")
    data["hosts"]["h2"]["services"]["a"].update(mode="shadow", draft_model=dict(DRAFT))
    if monitoring is not None:
        data["monitoring"] = monitoring
    return data


def monitor_fleet(monitoring: dict[str, Any] | None = None) -> Inventory:
    return parse_inventory(monitor_data(monitoring))
