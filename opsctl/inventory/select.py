"""Host and service selectors. A selector that matches nothing is an error, never "all"."""

from __future__ import annotations

from opsctl.errors import SelectorError
from opsctl.inventory.model import Host, Inventory, Router, Service


def select(
    inventory: Inventory, hosts: list[str] | None = None, services: list[str] | None = None
) -> list[tuple[Host, list[Service]]]:
    """Hosts (in inventory order) with their selected services. Hosts with no selected service are dropped
    when a service selector is given."""
    known_hosts = [h.name for h in inventory.hosts]
    for name in hosts or []:
        if name not in known_hosts:
            raise SelectorError(f"--host {name} matches no host", f"known hosts: {', '.join(known_hosts)}")
    chosen = [h for h in inventory.hosts if hosts is None or h.name in hosts]
    known_services = {s.name for h in chosen for s in h.services}
    for name in services or []:
        if name not in known_services:
            listed = ", ".join(sorted(known_services)) or "none"
            raise SelectorError(f"--service {name} matches no service", f"known services: {listed}")
    result: list[tuple[Host, list[Service]]] = []
    for host in chosen:
        picked = [s for s in host.services if services is None or s.name in services]
        if picked or services is None:
            result.append((host, picked))
    return result


def select_routers(inventory: Inventory, names: list[str] | None, hosts: list[str] | None = None) -> list[Router]:
    """Routers by name (`--router`), else every router (on the selected hosts when `hosts` is given)."""
    known = [r.name for r in inventory.routers]
    for name in names or []:
        if name not in known:
            raise SelectorError(f"--router {name} matches no router", f"known routers: {', '.join(known) or 'none'}")
    return [
        r
        for r in inventory.routers
        if (names is None or r.name in names) and (names is not None or hosts is None or r.host in hosts)
    ]
