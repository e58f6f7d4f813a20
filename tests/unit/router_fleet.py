"""The router tests' one inventory builder: hosts of tiny reference services behind one router, `front` on h1.

`fleet_data(...)` is the inventory as parsed YAML (for tests that edit it or expect an error from it); `fleet(...)`
parses it. Keyword arguments set the router's keys; a key given as None is left out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opsctl.inventory.load import parse_inventory
from opsctl.inventory.model import Inventory

# host -> service -> port; hosts are addressed 10.0.0.1, 10.0.0.2, ... in this order
TWO_HOSTS: Mapping[str, Mapping[str, int]] = {"h1": {"a": 30000, "b": 30001}, "h2": {"a": 30000}}
ONE_REF: Mapping[str, Mapping[str, int]] = {"h1": {"ref": 30000}}
TWO_REFS: Mapping[str, Mapping[str, int]] = {"h1": {"ref": 30000}, "h2": {"ref": 30000}}


def service(port: int = 30000, **extra: Any) -> dict[str, Any]:
    """A reference-engine baseline service on CPU, its model already on the host."""
    return {
        "port": port,
        "mode": "baseline",
        "engine": "reference",
        "device": "cpu",
        "model": {"source": "/data/m", "source_on": "host", "path": "/dev/shm/m", "hybrid": False},
        **extra,
    }


def fleet_data(
    hosts: Mapping[str, Mapping[str, int]] = TWO_HOSTS,
    router: bool = True,
    defaults: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "hosts": {
            name: {"address": f"10.0.0.{i}", "services": {svc: service(port) for svc, port in services.items()}}
            for i, (name, services) in enumerate(hosts.items(), 1)
        }
    }
    if defaults is not None:
        data["defaults"] = dict(defaults)
    if router:
        front: dict[str, Any] = {"host": "h1", "port": 30080}
        for key, value in spec.items():
            if value is None:
                front.pop(key, None)
            else:
                front[key] = value
        data["routers"] = {"front": front}
    return data


def fleet(
    hosts: Mapping[str, Mapping[str, int]] = TWO_HOSTS,
    router: bool = True,
    defaults: Mapping[str, Any] | None = None,
    **spec: Any,
) -> Inventory:
    return parse_inventory(fleet_data(hosts, router, defaults, **spec))
