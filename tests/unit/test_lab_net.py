"""Pure parts of the lab: address plan, route collisions, preflight messages."""

from __future__ import annotations

import ipaddress

import pytest

from opsctl.errors import LabError
from opsctl.lab import system
from opsctl.lab.config import LabConfig
from opsctl.lab.net import collisions

SUBNET = ipaddress.IPv4Network("10.213.0.0/24")


def test_address_plan() -> None:
    cfg = LabConfig()
    assert str(cfg.gateway) == "10.213.0.1"
    assert [str(cfg.address(i)) for i in (1, 2)] == ["10.213.0.11", "10.213.0.12"]
    assert cfg.netns("lab1") == "olab-lab1" and cfg.bridge == "olab0"
    small = LabConfig(subnet=ipaddress.IPv4Network("10.9.0.0/28"))
    with pytest.raises(ValueError):
        small.address(5)


def test_collisions_ignore_default_and_the_lab_bridge() -> None:
    routes = [
        {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
        {"dst": "192.0.2.0/24", "dev": "eth0"},
        {"dst": "10.213.0.0/24", "dev": "olab0"},
    ]
    assert collisions(routes, SUBNET, "olab0") == []


def test_collisions_found_for_overlaps_and_host_routes() -> None:
    routes = [
        {"dst": "10.0.0.0/8", "dev": "tun0"},
        {"dst": "10.213.0.77", "dev": "wg0"},
        {"dst": "10.214.0.0/24", "dev": "eth1"},
    ]
    assert collisions(routes, SUBNET, "olab0") == ["10.0.0.0/8 dev tun0", "10.213.0.77 dev wg0"]


def test_preflight_names_missing_tool_and_apt_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(system.shutil, "which", lambda tool: None if tool == "mmdebstrap" else "/usr/bin/x")
    with pytest.raises(LabError) as info:
        system.preflight()
    assert info.value.one_line() == (
        "the lab needs mmdebstrap (package mmdebstrap) "
        "(run: apt-get install -y systemd-container mmdebstrap iproute2 openssh-client rsync)"
    )


def test_preflight_refuses_non_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    with pytest.raises(LabError) as info:
        system.preflight()
    assert "needs root" in info.value.one_line() and info.value.hint == "run it with sudo"
