"""`opsctl monitor render`: the exact targets, the rules' thresholds and runbook links, the dashboard's required
fields and its read-back through Grafana's SDK, stale targets removed, nothing secret written."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as grafana

from opsctl.cli.monitor import write_files
from opsctl.inventory.load import load_inventory, parse_inventory
from opsctl.monitor.dashboard import dashboard
from opsctl.monitor.render import MonitorFile, render_monitoring
from opsctl.monitor.rules import RUNBOOK_ANCHORS
from tests.conftest import run_cli
from tests.unit.big_inventory import big_inventory
from tests.unit.monitor_fleet import monitor_data, monitor_fleet
from tests.unit.router_fleet import fleet_data


def _files(monitoring: dict[str, object] | None = None) -> dict[str, str]:
    return {f.path: f.text for f in render_monitoring(monitor_fleet(monitoring))}


def test_one_target_file_per_service_and_router_with_the_inventorys_labels() -> None:
    files = _files()
    assert sorted(p for p in files if p.startswith("targets/")) == [
        "targets/routers/front.json",
        "targets/services/h1.a.json",
        "targets/services/h1.b.json",
        "targets/services/h2.a.json",
    ]
    assert json.loads(files["targets/services/h1.a.json"]) == [
        {
            "targets": ["10.0.0.1:30000"],
            "labels": {
                "host": "h1",
                "service": "a",
                "worker": "h1/a",
                "mode": "tree",
                "engine": "reference",
                "model": "tiny",
            },
        }
    ]
    assert json.loads(files["targets/services/h2.a.json"])[0]["labels"]["model"] == "m"  # the model's directory
    assert json.loads(files["targets/routers/front.json"]) == [
        {"targets": ["10.0.0.1:30081"], "labels": {"host": "h1", "router": "front"}}
    ]
    config = yaml.safe_load(files["prometheus.yml"])
    assert config["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    assert [j["file_sd_configs"][0]["files"] for j in config["scrape_configs"]] == [
        ["targets/services/*.json"],
        ["targets/routers/*.json"],
    ]
    assert config["rule_files"] == ["rules/recording.yml", "rules/alerts.yml"]
    relabels = config["scrape_configs"][1]["metric_relabel_configs"]
    assert relabels[:2] == [
        {"source_labels": ["worker"], "regex": "(.+)", "target_label": "worker_url", "replacement": "$1"},
        {"action": "labeldrop", "regex": "worker"},
    ]
    assert relabels[2] == {  # the router's worker URL -> the inventory's host/service, as on the services' series
        "source_labels": ["worker_url"],
        "regex": r"http://10\.0\.0\.1:30000/?",
        "target_label": "worker",
        "replacement": "h1/a",
    }
    assert [r["replacement"] for r in relabels[2:]] == ["h1/a", "h1/b", "h2/a"]


def test_target_files_of_names_that_join_alike_do_not_collide() -> None:
    """host `lab` + service `1-gpu0` and host `lab-1` + service `gpu0`: two files, both scraped."""
    data = fleet_data({"lab": {"1-gpu0": 30000}, "lab-1": {"gpu0": 30000}}, router=False)
    files = [f.path for f in render_monitoring(parse_inventory(data)) if f.path.startswith("targets/services/")]
    assert sorted(files) == ["targets/services/lab-1.gpu0.json", "targets/services/lab.1-gpu0.json"]


def test_alerts_carry_the_inventorys_thresholds_and_runbook_links() -> None:
    url = "https://git.example.com/ops/runbook.md"
    monitoring = {"ttft_p95": 2.5, "ttft_for": 120, "service_down_for": 30, "tau_ratio": 0.6, "runbook_url": url}
    rules = {r["alert"]: r for r in yaml.safe_load(_files(monitoring)["rules/alerts.yml"])["groups"][0]["rules"]}
    assert set(rules) == set(RUNBOOK_ANCHORS)
    assert (
        rules["OpsctlTTFTHigh"]["expr"] == "opsctl:ttft_seconds:p95 > 2.5" and rules["OpsctlTTFTHigh"]["for"] == "120s"
    )
    assert rules["OpsctlServiceDown"]["for"] == "30s"
    assert rules["OpsctlTauDrop"]["expr"] == "opsctl:ddtree_tau:rate < 0.6 * opsctl:ddtree_tau:baseline"
    assert "smg_worker_health" in rules["OpsctlRouterNoHealthyWorkers"]["expr"]  # the router's own view
    assert rules["OpsctlRouterNoHealthyWorkers"]["labels"] == {"severity": "critical"}
    for name, rule in rules.items():
        assert rule["annotations"]["runbook_url"] == f"{url}#{RUNBOOK_ANCHORS[name]}"
    runbook = (Path(__file__).parents[2] / "docs" / "runbook.md").read_text()
    for name in RUNBOOK_ANCHORS:  # every link lands on a heading of docs/runbook.md (GitHub's anchors)
        assert f"### {name}\n" in runbook, name


def test_dashboard_has_the_fields_grafana_requires() -> None:
    board = dashboard()
    assert {"uid", "title", "schemaVersion", "panels", "templating", "time"} <= set(board)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    rows = [(p["title"], p.get("repeat")) for p in board["panels"] if p["type"] == "row"]
    assert rows == [("fleet", None), ("routers", None), ("$worker", "worker")]
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "host", "mode", "model", "service", "worker"]
    for var in board["templating"]["list"][1:]:
        assert (
            var["multi"]
            and var["includeAll"]
            and var["query"]["query"].startswith('label_values(up{job="opsctl-services"')
        )
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"} and grid["x"] + grid["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"] and all(t["refId"] and t["expr"] for t in panel["targets"])
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    exprs = " ".join(t["expr"] for p in board["panels"] if p["type"] != "row" for t in p["targets"])
    assert 'ddtree_tree_nodes_sum{worker="$worker"}' in exprs and "smg_worker_health" in exprs
    assert "h1" not in exprs  # no host or service of the inventory in a query: the variables select them
    # panels never overlap
    cells = [(p["gridPos"]["y"] + dy, p["gridPos"]["x"] + dx) for p in board["panels"]
             for dy in range(p["gridPos"]["h"]) for dx in range(p["gridPos"]["w"])]  # fmt: skip
    assert len(cells) == len(set(cells))


def _read_back(board: dict[str, Any]) -> dict[str, Any]:
    """The board through the SDK's typed model (panel options and Prometheus queries included), as JSON again: a
    field the Grafana 11.6 schema does not have is dropped."""
    plugins.register_default_plugins()  # panel options and dataqueries decode to their plugin's types
    data: dict[str, Any] = json.loads(json.dumps(grafana.Dashboard.from_json(board), cls=JSONEncoder))
    return data


def test_the_dashboard_round_trips_through_the_sdks_dashboard_model() -> None:
    text = _files()["grafana/opsctl-fleet.json"]
    board = json.loads(text)
    assert _read_back(board) == board
    assert board["schemaVersion"] == grafana.Dashboard().schema_version == 41  # Grafana 11.6's


def _set(path: tuple[str | int, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def change(board: dict[str, Any]) -> None:
        node: Any = board
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


@pytest.mark.parametrize(
    "change",
    [
        _set(("panels", 3, "unitt"), "short"),  # a panel field
        _set(("panels", 3, "options", "legend", "placment"), "bottom"),  # a time series option
        _set(("panels", 5, "options", "sortby"), []),  # a table option
        _set(("panels", 3, "targets", 0, "exp"), "up"),  # a Prometheus query field
        _set(("templating", "list", 1, "definition"), "label_values(host)"),  # a variable field
    ],
)
def test_the_read_back_drops_what_the_schema_lacks(change: Callable[[dict[str, Any]], None]) -> None:
    """The round trip above can fail: a field outside the schema does not come back."""
    board = copy.deepcopy(dashboard())
    change(board)
    assert _read_back(board) != board


def test_the_cli_starts_without_grafanas_sdk() -> None:
    """Only `monitor render` needs the SDK (~0.1 s to import): the CLI's start does not import it."""
    code = "import sys, opsctl.cli.app; print(sorted(m for m in sys.modules if m.startswith('grafana')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_the_dashboard_of_2200_services_is_the_dashboard_of_3() -> None:
    small = _files()["grafana/opsctl-fleet.json"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.yaml"
        path.write_text(big_inventory())
        big_inv = load_inventory(path)
    assert sum(len(h.services) for h in big_inv.hosts) == 2200
    big = next(f.text for f in render_monitoring(big_inv) if f.path == "grafana/opsctl-fleet.json")
    assert big == small and len(big.encode()) < 100_000, len(big.encode())


def test_write_removes_stale_targets_only(tmp_path: Path) -> None:
    (tmp_path / "targets" / "services").mkdir(parents=True)
    (tmp_path / "targets" / "services" / "gone-x.json").write_text("[]")
    (tmp_path / "targets" / "services" / "README").write_text("mine")
    files = render_monitoring(monitor_fleet())
    assert write_files(tmp_path, files) == 1
    assert not (tmp_path / "targets" / "services" / "gone-x.json").exists()
    assert (tmp_path / "targets" / "services" / "README").read_text() == "mine"
    assert {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()} == {f.path for f in files} | {
        "targets/services/README"
    }
    assert write_files(tmp_path, [MonitorFile("prometheus.yml", "x")]) == 4


def test_cli_writes_and_prints_without_secrets(tmp_path: Path) -> None:
    data = monitor_data()
    data["hosts"]["h1"]["services"]["a"]["api_key"] = "env:SVC_KEY"
    data["routers"]["front"]["api_key"] = "env:SVC_KEY"
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(data))
    result = run_cli(
        "monitor", "render", "-i", str(inv), "--out", str(tmp_path / "out"), env={"SVC_KEY": "s3cret-v4lue"}
    )
    assert result.exit_code == 0, result.stderr
    assert "wrote 8 files" in result.stderr
    printed = run_cli("monitor", "render", "-i", str(inv), "--json", env={"SVC_KEY": "s3cret-v4lue"})
    assert printed.exit_code == 0 and set(json.loads(printed.stdout)) == {f for f in _files()}
    written = "".join(p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert "s3cret" not in written and "SVC_KEY" not in written and "s3cret" not in printed.stdout


def test_cli_notes_a_relative_runbook_url_and_not_an_absolute_one(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(monitor_data()))
    relative = run_cli("monitor", "render", "-i", str(inv), "--out", str(tmp_path / "a"))
    assert relative.exit_code == 0 and (
        "note: the alerts' runbook_url is the relative path docs/runbook.md" in relative.stderr
        and "set monitoring.runbook_base_url" in relative.stderr
    )
    for key, value, link in (
        ("runbook_url", "https://git.example.com/o/r/runbook.md", "https://git.example.com/o/r/runbook.md"),
        ("runbook_base_url", "https://git.example.com/o/r/docs", "https://git.example.com/o/r/docs/runbook.md"),
    ):
        inv.write_text(yaml.safe_dump(monitor_data({key: value})))
        absolute = run_cli("monitor", "render", "-i", str(inv), "--out", str(tmp_path / key))
        assert absolute.exit_code == 0 and "note:" not in absolute.stderr
        assert f"runbook_url: {link}#opsctlservicedown" in (tmp_path / key / "rules/alerts.yml").read_text()
    both = {"runbook_url": "https://x/r.md", "runbook_base_url": "https://x/docs"}
    inv.write_text(yaml.safe_dump(monitor_data(both)))
    refused = run_cli("monitor", "render", "-i", str(inv), "--out", str(tmp_path / "c"))
    assert refused.exit_code != 0 and "Traceback" not in refused.stderr + refused.stdout
    assert "monitoring.runbook_url: runbook_url and runbook_base_url are both set" in refused.stderr
    assert not (tmp_path / "c").exists()
