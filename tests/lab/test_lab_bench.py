"""`opsctl bench` on a lab host: baseline, linear and tree side by side (table, JSON, PNG), then a budget sweep
that redeploys through the gated deploy path and restores the original release."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.lab.deploy_support import (
    REPO,
    add_service,
    current_release,
    derived_inventory,
    only_hosts,
    opsctl,
    provision,
    service,
    tune,
)

pytestmark = pytest.mark.lab
PROMPTS = str(REPO / "inventory" / "lab-prompts.yaml")


@pytest.fixture(scope="module")
def bench_inventory(lab_hosts, tmp_path_factory) -> Path:
    result = provision()
    assert result.returncode == 0, result.stderr[-3000:]

    def mutate(doc):
        only_hosts(doc, ["lab1"])
        service(doc, "lab1")["mode"] = "tree"
        add_service(doc, "lab1", "base", 30001, mode="baseline")
        add_service(doc, "lab1", "lin", 30002, mode="linear")
        tune(doc)

    inv = derived_inventory(tmp_path_factory.mktemp("bench") / "lab.yaml", mutate)
    deployed = opsctl("deploy", "-i", str(inv))
    assert deployed.returncode == 0, deployed.stderr[-3000:]
    return inv


def test_bench_side_by_side(bench_inventory: Path, tmp_path: Path) -> None:
    chart = tmp_path / "bench.png"
    args = ["--repeat", "2", "--max-tokens", "32", "--prompts", PROMPTS, "--chart", str(chart)]
    result = opsctl("bench", "-i", str(bench_inventory), "--services", "base,lin,ref", *args, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert [a["mode"] for a in data["arms"]] == ["baseline", "linear", "tree"]
    assert data["settings"] == {"repeat": 2, "max_tokens": 32, "temperature": 0, "warmup": 1, "thinking": False}
    for arm in data["arms"]:
        assert len(arm["samples"]) == 2 * 10  # 10 prompts x 2 repeats
        for sample in arm["samples"]:
            assert 0 < sample["completion_tokens"] <= 32
            assert sample["tok_s"] == pytest.approx(sample["completion_tokens"] / sample["wall_s"])
            assert 0 < sample["ttft_s"] <= sample["wall_s"]
        summary = arm["summary"]
        assert summary["completion_tokens"] == sum(s["completion_tokens"] for s in arm["samples"])
        assert summary["tok_s"]["median"] == pytest.approx(statistics.median(s["tok_s"] for s in arm["samples"]))
        assert summary["tok_s"]["min"] <= summary["tok_s"]["median"] <= summary["tok_s"]["max"]
    assert data["arms"][0]["summary"]["ratio_to_first"] == pytest.approx(1.0)
    tree = data["arms"][2]
    assert tree["accept_length"] > 1.0  # the distilled tiny drafter accepts tokens: tau from the server
    assert tree["budget"] is not None
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    table = opsctl("bench", "-i", str(bench_inventory), "--services", "base,ref", "--repeat", "1",
                   "--max-tokens", "16", "--prompts", PROMPTS)  # fmt: skip
    assert table.returncode == 0, table.stderr[-3000:]
    assert "tok/s med" in table.stderr and "lab1/ref" in table.stderr and "vs first" in table.stderr


def test_budget_sweep_restores_the_original_release(bench_inventory: Path) -> None:
    before = current_release(bench_inventory, "lab1", "ref")
    result = opsctl(
        "bench", "-i", str(bench_inventory), "--services", "ref", "--sweep", "budget=4,16",
        "--repeat", "1", "--max-tokens", "24", "--prompts", PROMPTS, "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    arms = json.loads(result.stdout)["arms"]
    assert [(a["label"], a["budget"]) for a in arms] == [("ref budget=4", 4), ("ref budget=16", 16)]
    assert all(a["accept_length"] and a["accept_length"] > 1.0 for a in arms)
    assert current_release(bench_inventory, "lab1", "ref") == before
