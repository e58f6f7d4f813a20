"""A real Prometheus (Debian's package) scrapes the lab's services through the files `opsctl monitor render`
writes: the `ddtree_*` series appear after traffic (and `opsctl status` shows their numbers), OpsctlServiceDown
fires within its `for:` window plus a scrape interval (and the evaluation's) after a service stops, and resolves
after `opsctl deploy --force` heals it; every query of the dashboard returns data from that Prometheus."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from opsctl.commands import Cmd
from opsctl.monitor.dashboard import dashboard
from tests.lab.deploy_support import MODE, opsctl, provisioned_and_deployed, remote_run, tune

pytestmark = pytest.mark.lab

PROMETHEUS = shutil.which("prometheus")
SCRAPE, DOWN_FOR = 1, 5  # seconds: the test inventory's monitoring: keys
SLACK = 10.0  # seconds a loaded 2-core CI box may add to the rule evaluation and the API's answer


def _monitored(doc: dict[str, Any]) -> None:
    tune(doc, log_interval=1)  # a DDTREE metrics line, and so a move of the ddtree_* series, every round
    doc["monitoring"] = {"scrape_interval": SCRAPE, "service_down_for": DOWN_FOR}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            return json.loads(response.read())

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/query", query=expr)["data"]["result"])

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:  # not listening yet (URLError is an OSError)
            return False

    def firing(self, alert: str) -> list[dict[str, str]]:
        alerts = self.get("/api/v1/alerts")["data"]["alerts"]
        return [a["labels"] for a in alerts if a["labels"]["alertname"] == alert and a["state"] == "firing"]


def _until(found: Callable[[], Any], what: str, timeout: float) -> tuple[Any, float]:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        value = found()
        if value:
            return value, time.monotonic() - start
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


@pytest.fixture(scope="module")
def inventory(lab_hosts: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return provisioned_and_deployed(tmp_path_factory.mktemp("monitoring") / "lab.yaml", _monitored)


@contextmanager
def running_prometheus(inventory: Path, out: Path) -> Iterator[Prom]:
    """Debian's Prometheus on what `opsctl monitor render` wrote for `inventory` under `out`, until the block ends."""
    if PROMETHEUS is None:
        pytest.skip("prometheus missing: scripts/setup installs Debian's prometheus")
    rendered = opsctl("monitor", "render", "-i", str(inventory), "--out", str(out / "conf"))
    assert rendered.returncode == 0, rendered.stderr
    port = _free_port()
    log = (out / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={out / 'conf' / 'prometheus.yml'}", f"--storage.tsdb.path={out / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    p = Prom(f"http://127.0.0.1:{port}")
    try:
        _until(lambda: proc.poll() is None and p.ready(), "Prometheus ready", 60)
        yield p
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def prom(inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    with running_prometheus(inventory, tmp_path_factory.mktemp("prometheus")) as p:
        yield p


def test_ddtree_series_then_service_down_fires_and_resolves_after_deploy(inventory: Path, prom: Prom) -> None:
    smoke = opsctl("smoke", "-i", str(inventory))  # traffic: one chat request per service
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    services = [(h, n) for h, d in yaml.safe_load(inventory.read_text())["hosts"].items() for n in d["services"]]
    assert len(services) == 2, services  # the lab's two hosts, one service each

    def all_up() -> list[dict[str, Any]]:
        ups = [r for r in prom.query('up{job="opsctl-services"}') if r["value"][1] == "1"]
        return ups if len(ups) == len(services) else []

    ups, _ = _until(all_up, "every service up", 30)
    hosts = sorted(r["metric"]["host"] for r in ups)
    assert hosts == sorted(h for h, _ in services) and all(r["metric"]["mode"] == MODE for r in ups)
    rounds, _ = _until(lambda: prom.query("ddtree_rounds_total > 0"), "ddtree_rounds_total after traffic", 30)
    assert all(float(r["value"][1]) == int(float(r["value"][1])) for r in rounds)
    assert sorted(r["metric"]["host"] for r in rounds) == hosts
    assert all(r["metric"]["service"] == "ref" and r["metric"]["model_name"] for r in rounds)
    assert prom.query("ddtree_committed_tokens_total >= ddtree_rounds_total")  # tau >= 1
    assert prom.firing("OpsctlServiceDown") == []
    # opsctl status reads its DDTREE numbers from the same series (means since start), not from the journal
    shown = json.loads(opsctl("status", "-i", str(inventory), "--json").stdout)["services"]
    assert sorted((r["host"], r["metrics_source"]) for r in shown) == [(h, "/metrics") for h in hosts]
    for row in shown:
        m = row["last_metrics"]
        assert m["rounds"] > 0 and m["tau"] == pytest.approx(m["tokens"] / m["rounds"]), m
        same = f'ddtree_rounds_total{{host="{row["host"]}"}} == {m["rounds"]}'
        _until(lambda same=same: prom.query(same), f"Prometheus' rounds equal status' on {row['host']}", 10)

    host = hosts[0]
    remote_run(inventory, host, Cmd.of("systemctl", "stop", "opsctl-ref.service"))
    fired, after = _until(lambda: prom.firing("OpsctlServiceDown"), "OpsctlServiceDown firing", 60)
    assert [(a["host"], a["service"]) for a in fired] == [(host, "ref")]
    assert after <= DOWN_FOR + SCRAPE + SCRAPE + SLACK, f"fired {after:.1f}s after the stop"

    t0 = time.monotonic()
    healed = opsctl("deploy", "-i", str(inventory), "--host", host, "--mode", MODE, "--force")
    assert healed.returncode == 0, healed.stderr[-4000:]
    deploy_s = time.monotonic() - t0
    _, resolved = _until(lambda: prom.firing("OpsctlServiceDown") == [], "OpsctlServiceDown resolved", 30)
    print(f"fired {after:.1f}s after the stop; deploy --force {deploy_s:.1f}s; resolved {resolved:.1f}s after it")


# panels with nothing to show on this lab: it has no router, no alert fires while the services run, and its
# services run without the shape policy
EMPTY_HERE = {
    "healthy workers (router's view)", "answers per second by status", "5xx share", "alerts firing",
    "policy shape (budget; 0 = chain)",
}  # fmt: skip


def _queries(worker: str) -> list[tuple[str, str]]:
    """(panel title, query) of every dashboard panel, its variables set as Grafana would: All, one worker."""
    subst = {
        "$__rate_interval": "1m",
        "$worker": worker,
        **{f"${v}": ".*" for v in ("host", "service", "mode", "model")},
    }
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in sorted(subst.items(), key=lambda kv: -len(kv[0])):  # $model before $mode
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def test_every_dashboard_query_returns_data(inventory: Path, prom: Prom) -> None:
    smoke = opsctl("smoke", "-i", str(inventory))  # traffic: every request-level series exists after it
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    ups, _ = _until(lambda: prom.query('up{job="opsctl-services"} == 1'), "a service up", 60)
    worker = ups[0]["metric"]["worker"]
    queries = [(t, q) for t, q in _queries(worker) if t not in EMPTY_HERE]
    assert len(queries) >= 20 and not any("$" in q for _, q in queries)
    # the recording rules' trailing group and the 5-minute windows need a few evaluations after the first samples
    for title, query in queries:
        _until(lambda query=query: prom.query(query), f"{title}: {query}", 120)
