"""The router's own view in a real Prometheus: behind the real sglang-router, both lab workers stopped while
clients keep calling: OpsctlRouterNoHealthyWorkers and OpsctlRouterErrors fire (no worker `up` series is read:
the router's `smg_worker_health` and its 5xx answers), and the router's `worker` label is relabelled to the
inventory's `host/service`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from opsctl.commands import Cmd
from tests.lab.deploy_support import MODE, derived_inventory, opsctl, provision, remote_run, tune
from tests.lab.test_monitoring import SLACK, _until, running_prometheus

pytestmark = pytest.mark.lab

ROUTER_PORT = 30080
SCRAPE, DOWN_FOR, ERRORS_FOR = 1, 5, 5  # seconds: the inventory's monitoring: keys


def _with_router(doc: dict[str, Any]) -> None:
    tune(doc)
    doc["monitoring"] = {"scrape_interval": SCRAPE, "service_down_for": DOWN_FOR, "error_for": ERRORS_FOR}
    doc["routers"] = {
        "front": {"host": "lab1", "port": ROUTER_PORT, "services": ["lab1/ref", "lab2/ref"], "policy": "round_robin"}
    }


def test_router_emptied_fires_on_its_own_view(lab_hosts: Any, tmp_path: Path) -> None:
    inv = derived_inventory(tmp_path / "lab.yaml", _with_router)
    provisioned = provision(inv)
    assert provisioned.returncode == 0, provisioned.stderr[-3000:]
    deployed = opsctl("deploy", "-i", str(inv), "--mode", MODE, timeout=1500)
    assert deployed.returncode == 0, deployed.stderr[-4000:]
    address = next(h.address for h in lab_hosts.hosts if h.name == "lab1")  # where the router runs
    with running_prometheus(inv, tmp_path / "prometheus") as prom:
        _until(
            lambda: len(prom.query('smg_worker_health{job="opsctl-routers"} == 1')) == 2 or [],
            "both workers healthy in the router's view", 90,
        )  # fmt: skip
        workers = sorted(r["metric"]["worker"] for r in prom.query('smg_worker_health{job="opsctl-routers"}'))
        assert workers == ["lab1/ref", "lab2/ref"]  # the router's URL label relabelled to the inventory's names
        assert prom.firing("OpsctlRouterNoHealthyWorkers") == []

        for host in ("lab1", "lab2"):
            remote_run(inv, host, Cmd.of("systemctl", "stop", "opsctl-ref.service"))
        stopped = time.monotonic()
        answers: list[int] = []
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

        def fired() -> list[dict[str, str]]:
            try:  # a client keeps calling through the router: its 5xx answers feed OpsctlRouterErrors
                answers.append(
                    httpx.post(f"http://{address}:{ROUTER_PORT}/v1/chat/completions", json=body, timeout=5).status_code
                )
            except httpx.HTTPError:
                answers.append(0)
            return prom.firing("OpsctlRouterNoHealthyWorkers")

        alerts, _ = _until(fired, "OpsctlRouterNoHealthyWorkers firing", 120)
        after = time.monotonic() - stopped
        assert [(a["host"], a["router"]) for a in alerts] == [("lab1", "front")]
        errors, _ = _until(lambda: prom.firing("OpsctlRouterErrors"), "OpsctlRouterErrors firing", 60)
        assert [a["router"] for a in errors] == ["front"] and any(500 <= code < 600 for code in answers)
        print(
            f"OpsctlRouterNoHealthyWorkers fired {after:.1f}s after the workers stopped; answers {sorted(set(answers))}"
        )
        assert after <= 60 + DOWN_FOR + SLACK  # the router's health checks, the for: window, a loaded machine

        for host in ("lab1", "lab2"):  # started again as they were (a deploy refuses to touch a router's last worker)
            remote_run(inv, host, Cmd.of("systemctl", "start", "opsctl-ref.service"))
        _until(lambda: prom.firing("OpsctlRouterNoHealthyWorkers") == [], "OpsctlRouterNoHealthyWorkers resolved", 120)
