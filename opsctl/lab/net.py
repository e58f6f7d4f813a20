"""Lab networking: one bridge on the control machine, one network namespace + veth pair per host.

Control machine: bridge olab0 with the subnet's .1. Host N: namespace olab-labN holding `host0` (the veth
peer) at .10+N; the other end is enslaved to the bridge. No default route in the namespaces: lab hosts reach
only the control machine and each other, and the lab sends traffic only to addresses it created.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from opsctl.errors import LabError
from opsctl.lab import system
from opsctl.lab.config import LabConfig

PEER = "host0"  # the interface name inside each host (what nspawn's own --network-veth would call it)


def collisions(routes: Iterable[Mapping[str, Any]], subnet: ipaddress.IPv4Network, own_dev: str) -> list[str]:
    """Routes (from `ip -j route`) that overlap the lab subnet, except the lab bridge's own route."""
    found = []
    for route in routes:
        dst = str(route.get("dst", ""))
        if not dst or dst == "default" or route.get("dev") == own_dev:
            continue
        try:
            network = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
        except ValueError:
            continue
        if network.version == 4 and network.overlaps(subnet):
            found.append(f"{dst} dev {route.get('dev', '?')}")
    return found


def check_subnet(cfg: LabConfig) -> None:
    """Refuse a lab subnet that overlaps an existing route (the lab would capture someone's traffic)."""
    routes = json.loads(system.run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    clash = collisions(routes, cfg.subnet, cfg.bridge)
    if clash:
        raise LabError(
            f"lab subnet {cfg.subnet} collides with existing route {clash[0]}",
            "choose another range with --subnet",
        )


def ensure_bridge(cfg: LabConfig) -> None:
    if not system.ok("ip", "link", "show", "dev", cfg.bridge):
        system.run("ip", "link", "add", cfg.bridge, "type", "bridge")
    addresses = system.run("ip", "-j", "-4", "addr", "show", "dev", cfg.bridge).stdout
    gateway = f"{cfg.gateway}/{cfg.subnet.prefixlen}"
    if str(cfg.gateway) not in addresses:
        system.run("ip", "addr", "add", gateway, "dev", cfg.bridge)
    system.run("ip", "link", "set", cfg.bridge, "up")


def create_host_net(cfg: LabConfig, netns: str, veth: str, address: str) -> None:
    """Namespace + veth pair + address; idempotent (a half-made one from a crash is completed)."""
    if netns not in list_netns():
        system.run("ip", "netns", "add", netns)
    if not system.ok("ip", "link", "show", "dev", veth):
        system.run("ip", "link", "add", veth, "type", "veth", "peer", "name", PEER, "netns", netns)
    system.run("ip", "link", "set", veth, "master", cfg.bridge, "up")
    inside = system.run("ip", "-n", netns, "-j", "-4", "addr", "show", "dev", PEER).stdout
    if address not in inside:
        system.run("ip", "-n", netns, "addr", "add", f"{address}/{cfg.subnet.prefixlen}", "dev", PEER)
    system.run("ip", "-n", netns, "link", "set", PEER, "up")
    system.run("ip", "-n", netns, "link", "set", "lo", "up")


def set_link(veth: str, up: bool) -> None:
    """The host's cable: down drops every packet both ways (no RST, no FIN), as a power cut or a partition."""
    system.run("ip", "link", "set", veth, "up" if up else "down")


def remove_host_net(netns: str, veth: str) -> None:
    if netns in list_netns():
        system.run("ip", "netns", "del", netns)  # deletes host0, and with it the veth pair (asynchronously)
    for _ in range(50):
        if not system.ok("ip", "link", "show", "dev", veth):
            return
        system.ok("ip", "link", "del", veth)  # fails harmlessly if the kernel removed it meanwhile
        time.sleep(0.1)
    raise LabError(f"cannot remove interface {veth}", f"remove it by hand: ip link del {veth}")


def remove_bridge(cfg: LabConfig) -> None:
    if system.ok("ip", "link", "show", "dev", cfg.bridge):
        system.run("ip", "link", "del", cfg.bridge)


def list_netns() -> list[str]:
    out = system.run("ip", "-j", "netns", "list").stdout.strip()
    return [entry["name"] for entry in json.loads(out or "[]")]


def lab_netns(cfg: LabConfig) -> list[str]:
    return [name for name in list_netns() if name.startswith(f"{cfg.prefix}-")]


def lab_links(cfg: LabConfig) -> list[str]:
    """Every interface in the root namespace that the lab made (bridge and veths)."""
    out = system.run("ip", "-j", "link", "show").stdout
    names = [str(link.get("ifname", "")) for link in json.loads(out or "[]")]
    return [n for n in names if n == cfg.bridge or n.startswith(f"{cfg.prefix}-")]


def netns_pids(netns: str) -> list[int]:
    proc = system.run("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]
