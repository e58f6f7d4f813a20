"""The `routers:` section: defaults that work, every error one line naming the key path, hostile input
(hypothesis) loads or fails in one line, never a traceback, never a secret shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.errors import InventoryError
from opsctl.inventory.load import load_inventory, parse_inventory
from opsctl.inventory.model import RouterPolicy, WorkerRef
from tests.conftest import run_cli
from tests.unit.router_fleet import fleet_data, service

BASE: dict[str, Any] = fleet_data()  # for modules that copy and edit it (router_fleet builds the rest)
SECRET = "hunter2-router-secret"


def error(data: dict[str, Any]) -> str:
    with pytest.raises(InventoryError) as info:
        parse_inventory(data)
    return info.value.one_line()


def test_defaults_front_every_service() -> None:
    (router,) = parse_inventory(fleet_data()).routers
    assert router.workers == (WorkerRef("h1", "a"), WorkerRef("h1", "b"), WorkerRef("h2", "a"))
    assert (router.policy, router.max_unavailable, router.prometheus_port, router.bind) == (
        RouterPolicy.CACHE_AWARE,
        1,
        30081,
        "0.0.0.0",
    )
    assert router.unit_name == "opsctl-router-front.service" and router.api_key is None


def test_explicit_services_policy_and_key() -> None:
    data = fleet_data(services=["h2/a", "h1/a"], policy="round_robin", api_key="env:ROUTER_KEY", max_unavailable=2)
    (router,) = parse_inventory(data).routers
    assert router.workers == (WorkerRef("h2", "a"), WorkerRef("h1", "a"))
    assert router.policy is RouterPolicy.ROUND_ROBIN and router.max_unavailable == 2
    assert str(router.api_key) == "***" and parse_inventory(data).routers_of("h1", "b") == ()


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"host": "h9"}, "routers.front.host: no host 'h9' in this inventory"),
        ({"host": None}, "routers.front.host: required key is missing"),
        ({"port": 30000}, "routers.front.port: 30000 already used by service a on h1"),
        ({"port": 70000}, "routers.front.port: 70000 is out of range (1024..65535)"),
        ({"metrics_port": 30001}, "routers.front.metrics_port: 30001 already used by service b on h1"),
        ({"metrics_port": 30080}, "routers.front.metrics_port: 30080 is the router's own port"),
        ({"port": 65535}, "routers.front.metrics_port: port + 1 is not a port"),
        ({"services": ["h1/zz"]}, "routers.front.services[0]: host h1 has no service 'zz'"),
        ({"services": ["h1"]}, "routers.front.services[0]: expected HOST/SERVICE, got 'h1'"),
        ({"services": ["h1/a", "h1/a"]}, "routers.front.services: h1/a is listed twice"),
        ({"services": []}, "routers.front.services: a router needs at least one service to front"),
        ({"policy": "fastest"}, "routers.front.policy: expected one of cache_aware, round_robin"),
        ({"api_key": SECRET}, "routers.front.api_key: literal secrets are not allowed"),
        ({"max_unavailable": 0}, "routers.front.max_unavailable: 0 is out of range (1..1024)"),
        ({"drain_timeout": -1}, "routers.front.drain_timeout: -1 is out of range (0..3600)"),
        ({"version": "latest"}, "routers.front.version: 'latest' is not an exact version"),
        ({"bind": "0.0.0.0\n"}, "routers.front.bind: '0.0.0.0\\n' is not a valid IP address or hostname"),
        ({"polcy": "random"}, "routers.front.polcy: unknown key (did you mean `policy`?)"),
    ],
)
def test_router_errors_name_the_key(change: dict[str, Any], fragment: str) -> None:
    message = error(fleet_data(**change))
    assert fragment in message and "\n" not in message and SECRET not in message


def test_loopback_worker_on_another_host_is_refused() -> None:
    data = fleet_data()
    data["hosts"]["h2"]["services"]["a"]["bind"] = "127.0.0.1"
    assert "routers.front.services: h2/a listens on 127.0.0.1 only: the router on h1 cannot reach it" in error(data)


def test_keyed_services_need_a_router_key() -> None:
    data = fleet_data(services=["h1/a"])
    data["hosts"]["h1"]["services"]["a"]["api_key"] = "env:SVC_KEY"
    assert "routers.front.api_key: h1/a needs an API key" in error(data)
    data["routers"]["front"]["api_key"] = "env:SVC_KEY"
    assert parse_inventory(data).routers[0].api_key is not None


def test_unit_clash_with_a_service_named_like_the_router() -> None:
    data = fleet_data()
    data["hosts"]["h1"]["services"]["router-front"] = service(30002)
    assert "host h1 has a service named router-front" in error(data)


def test_cli_error_is_one_line_exit_1(tmp_path: Path) -> None:
    file = tmp_path / "inv.yaml"
    file.write_text(json.dumps(fleet_data(api_key=SECRET)))
    result = run_cli("render", "-i", str(file), "--router", "front")
    assert result.exit_code == 1 and result.stderr.count("\n") <= 2, result.stderr
    assert "routers.front.api_key" in result.stderr and SECRET not in result.stderr + result.stdout


def test_unknown_router_selector_is_an_error(tmp_path: Path) -> None:
    file = tmp_path / "inv.yaml"
    file.write_text(json.dumps(fleet_data()))
    result = run_cli("render", "-i", str(file), "--router", "back")
    assert result.exit_code == 1 and "--router back matches no router (known routers: front)" in result.stderr


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["h1", "h1/a", "h2/a", "env:K", "random", "0.0.0.0", "::", "-x", "h1/a\n", "\x00"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
KEYS = st.sampled_from(
    ["host", "port", "bind", "services", "policy", "version", "api_key", "max_unavailable", "drain_timeout",
     "health_timeout", "readiness_delay", "health_check_interval", "metrics_port", "weird"]
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, VALUES, max_size=6), st.text(max_size=8) | st.sampled_from(["front", "r1"]))
def test_hostile_router_sections_load_or_fail_in_one_line(spec: dict[str, Any], name: str) -> None:
    data = fleet_data()
    data["routers"] = {name: spec}
    try:
        result = parse_inventory(data)
    except InventoryError as exc:
        line = exc.one_line()
        assert "\n" not in line and line.startswith("routers")
        return
    (router,) = result.routers
    assert 1024 <= router.port <= 65535 and router.workers and router.host in ("h1", "h2")


def test_routers_section_of_a_file(tmp_path: Path) -> None:
    file = tmp_path / "inv.yaml"
    file.write_text(json.dumps(fleet_data(services=["h1/a", "h2/a"])))
    assert [str(w) for w in load_inventory(file).router("front").workers] == ["h1/a", "h2/a"]


def test_render_router_json_and_text_never_show_the_key(tmp_path: Path) -> None:
    file = tmp_path / "inv.yaml"
    file.write_text(json.dumps(fleet_data(api_key="env:ROUTER_KEY")))
    env = {"ROUTER_KEY": SECRET}
    shown = run_cli("render", "-i", str(file), "--router", "front", "--json", env=env)
    assert shown.exit_code == 0, shown.stderr
    (item,) = json.loads(shown.stdout)
    assert item["argv"][-2:] == ["--api-key", "***"] and set(item["files"]) == {
        "unit",
        "env",
        "router.json",
        "launch.py",
    }
    text = run_cli("render", "-i", str(file), env=env)
    assert text.exit_code == 0 and "# ==> h1/router-front/router.json (mode 600)" in text.stdout
    assert SECRET not in shown.stdout + shown.stderr + text.stdout + text.stderr
