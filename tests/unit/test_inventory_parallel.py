"""Services across several GPUs: `tp`, `dp` and `nccl_port` in the inventory, their defaults, their
one-line errors, and the SGLang flags they render (opsctl.inventory.parallel, opsctl.render)."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opsctl.errors import InventoryError
from opsctl.inventory.load import load_inventory
from opsctl.inventory.model import Service
from opsctl.inventory.parallel import NCCL_PORT_BASE, default_nccl_port
from opsctl.render import render_service
from tests.conftest import run_cli

SERVICE: dict[str, Any] = {
    "gpus": [0, 1],
    "port": 30000,
    "mode": "tree",
    "ddtree": {"budget": 15},
    "model": {"source": "/data/m", "source_on": "host", "path": "/dev/shm/m", "hybrid": False},
    "draft_model": {"source": "/data/d", "source_on": "host", "path": "/dev/shm/d"},
}


def inventory(tmp_path: Path, services: dict[str, dict[str, Any]], gpus: int = 8) -> Path:
    data = {"hosts": {"h1": {"address": "10.0.0.1", "gpus": gpus, "services": services}}}
    file = tmp_path / "inv.yaml"
    file.write_text(json.dumps(data))
    return file


def service(tmp_path: Path, **keys: Any) -> Service:
    return load_inventory(inventory(tmp_path, {"s1": {**copy.deepcopy(SERVICE), **keys}})).hosts[0].services[0]


def flags(svc: Service, tmp_path: Path) -> tuple[str, ...]:
    host = load_inventory(inventory(tmp_path, {svc.name: {**SERVICE}})).hosts[0]
    return render_service(host, svc, "r").flags


def error(tmp_path: Path, services: dict[str, dict[str, Any]]) -> str:
    with pytest.raises(InventoryError) as err:
        load_inventory(inventory(tmp_path, services))
    return err.value.one_line()


def test_a_service_uses_all_its_gpus_as_tensor_parallel_ranks_by_default(tmp_path: Path) -> None:
    svc = service(tmp_path)
    assert (svc.tp, svc.dp, svc.nccl_port) == (2, 1, 20000)
    f = flags(svc, tmp_path)
    assert f[f.index("--tp-size") + 1] == "2" and f[f.index("--nccl-port") + 1] == "20000"
    assert "--dp-size" not in f
    one = service(tmp_path, gpus=[3], port=31999)
    assert (one.tp, one.dp, one.nccl_port) == (1, 1, None)
    assert not {"--tp-size", "--dp-size", "--nccl-port"} & set(flags(one, tmp_path))


def test_tp_or_dp_alone_takes_the_rest_of_the_gpus(tmp_path: Path) -> None:
    four = [0, 1, 2, 3]
    assert (service(tmp_path, gpus=four, tp=2).tp, service(tmp_path, gpus=four, tp=2).dp) == (2, 2)
    replicas = service(tmp_path, gpus=four, dp=4)
    assert (replicas.tp, replicas.dp, replicas.nccl_port) == (1, 4, None)
    both = service(tmp_path, gpus=four, tp=2, dp=2)
    assert both.nccl_port is None  # SGLang picks one port per replica
    f = flags(both, tmp_path)
    assert f[f.index("--tp-size") + 1] == "2" and f[f.index("--dp-size") + 1] == "2" and "--nccl-port" not in f
    assert service(tmp_path, nccl_port=21000).nccl_port == 21000


def test_the_written_server_config_carries_the_flags(tmp_path: Path) -> None:
    host = load_inventory(inventory(tmp_path, {"s1": SERVICE})).hosts[0]
    config = yaml.safe_load(render_service(host, host.services[0], "r").server_config)
    assert (config["tp-size"], config["nccl-port"]) == (2, 20000)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"tp": 3}, "hosts.h1.services.s1.tp: 3 does not divide the service's 2 GPUs"),
        ({"dp": 4}, "hosts.h1.services.s1.dp: 4 does not divide the service's 2 GPUs"),
        ({"tp": 2, "dp": 2}, "hosts.h1.services.s1.tp: tp 2 x dp 2 is 4 GPUs, but the service lists 2"),
        ({"tp": 0}, "hosts.h1.services.s1.tp: 0 is out of range (1..64)"),
        ({"tp": "2"}, "hosts.h1.services.s1.tp: expected an integer, got a string"),
        ({"dp": True}, "hosts.h1.services.s1.dp: expected an integer"),
        ({"tp": 2.5}, "hosts.h1.services.s1.tp: expected an integer"),
        ({"gpus": [0], "nccl_port": 21000}, "nccl_port: is only used with tp > 1 and dp 1: it runs one rank (tp 1)"),
        ({"dp": 2, "nccl_port": 21000}, "nccl_port: is only used with tp > 1 and dp 1: SGLang picks one port per"),
        ({"nccl_port": 80}, "hosts.h1.services.s1.nccl_port: 80 is out of range (1024..65535)"),
        ({"nccl_port": 30000}, "nccl_port: 30000 is already used as s1's port"),
        (
            {"engine": "reference", "device": "cuda", "tp": 2},
            "hosts.h1.services.s1.tp: 2: the reference engine runs on one device",
        ),
        (
            {"engine": "reference", "device": "cuda", "nccl_port": 21000},
            "nccl_port: only SGLang services across several GPUs",
        ),
    ],
)
def test_bad_parallel_keys_fail_in_one_line_naming_the_key(tmp_path: Path, keys: dict[str, Any], expected: str) -> None:
    line = error(tmp_path, {"s1": {**SERVICE, **keys}})
    assert expected in line and "\n" not in line


def test_nccl_ports_of_a_host_never_clash(tmp_path: Path) -> None:
    a = {**SERVICE, "gpus": [0, 1], "port": 30000}
    b = {**SERVICE, "gpus": [2, 3], "port": 32000}  # the same default, 20000
    assert "services.b.nccl_port: 20000 is already used as a's nccl_port" in error(tmp_path, {"a": a, "b": b})
    assert "services.b.nccl_port: 30000 is already used as a's port" in error(
        tmp_path, {"a": a, "b": {**b, "nccl_port": 30000}}
    )
    host = load_inventory(inventory(tmp_path, {"a": a, "b": {**b, "nccl_port": 21000}})).hosts[0]
    assert [s.nccl_port for s in host.services] == [20000, 21000]


def test_a_port_another_process_may_take_warns(tmp_path: Path) -> None:
    for port, where in ((25000, "SGLang's own NCCL port range"), (40000, "the ephemeral range")):
        loaded = load_inventory(inventory(tmp_path, {"s1": {**SERVICE, "nccl_port": port}}))
        assert any(f"nccl_port: {port} is in {where}" in w for w in loaded.warnings)
    assert not load_inventory(inventory(tmp_path, {"s1": SERVICE})).warnings


def test_the_cli_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    result = run_cli("render", "--inventory", str(inventory(tmp_path, {"s1": {**SERVICE, "tp": 3}})))
    assert result.exit_code == 1
    lines = (result.stderr + result.stdout).strip().splitlines()
    assert len(lines) == 1 and "tp: 3 does not divide the service's 2 GPUs" in lines[0], lines


HOSTILE = st.one_of(
    st.none(),
    st.integers(-3, 70),
    st.booleans(),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=2),
    st.sampled_from(["2", "0x2", "1e1", "auto", "-1", "２"]),
)


@settings(
    max_examples=100, derandomize=True, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    gpus=st.integers(1, 8),
    keys=st.dictionaries(st.sampled_from(["tp", "dp", "nccl_port"]), HOSTILE, max_size=3),
    engine=st.sampled_from(["sglang", "reference"]),
    port=st.integers(1024, 65535),
)
def test_any_parallel_keys_load_consistently_or_fail_in_one_line(
    gpus: int, keys: dict[str, Any], engine: str, port: int
) -> None:
    svc = {**SERVICE, "gpus": list(range(gpus)), "port": port, "engine": engine, "device": "cuda", **keys}
    data = json.dumps({"hosts": {"h1": {"address": "10.0.0.1", "gpus": 8, "services": {"s1": svc}}}})
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "inv.yaml"
        file.write_text(data)
        try:
            host = load_inventory(file).hosts[0]
        except InventoryError as exc:
            line = exc.one_line()
            assert line.startswith("hosts.h1.services.s1.") and "\n" not in line and line.isprintable(), line
            return
    loaded = host.services[0]
    if engine == "reference":
        assert (loaded.tp, loaded.dp, loaded.nccl_port) == (1, 1, None)
        return
    assert loaded.tp * loaded.dp == gpus
    for key in ("tp", "dp"):
        if keys.get(key) is not None:
            assert getattr(loaded, key) == keys[key]
    if loaded.tp > 1 and loaded.dp == 1:
        want = keys.get("nccl_port")
        assert loaded.nccl_port == (want if want is not None else default_nccl_port(port))
        assert loaded.nccl_port != port
    else:
        assert loaded.nccl_port is None
    f = render_service(host, loaded, "r").flags
    rendered = {flag: f[f.index(flag) + 1] for flag in ("--tp-size", "--dp-size", "--nccl-port") if flag in f}
    expected = {"--tp-size": loaded.tp, "--dp-size": loaded.dp, "--nccl-port": loaded.nccl_port}
    assert rendered == {k: str(v) for k, v in expected.items() if v is not None and (k == "--nccl-port" or v > 1)}
    assert NCCL_PORT_BASE <= default_nccl_port(port) < 22000
