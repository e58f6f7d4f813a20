"""The whole journey on 2 lab hosts, through the real CLI: provision, deploy --mode shadow, smoke, deploy
--mode tree, smoke --equivalence against a baseline service (100%), logs --metrics (tau > 1), status,
rollback (back to shadow, healthy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lab.deploy_support import (
    add_service,
    current_mode,
    current_release,
    derived_inventory,
    opsctl,
    provision,
    tune,
)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def journey_inventory(lab_hosts, tmp_path_factory) -> Path:
    result = provision()
    assert result.returncode == 0, result.stderr[-3000:]

    def mutate(doc):
        add_service(doc, "lab1", "base", 30001, mode="baseline")
        tune(doc)

    return derived_inventory(tmp_path_factory.mktemp("journey") / "lab.yaml", mutate)


# The tiny lab model knows a handful of tasks (ddtree.tiny's corpus); on these its distilled drafter accepts
# several tokens per round, so the lab's 2 shared CPUs get through the comparison in reasonable time. The
# shipped 24-prompt default set is exercised by the unit tests and works the same way on real models.
TINY_PROMPTS = [
    "count from 43 to 50", "json for dave, age 47, from delhi", "write mul for 4 and 9", "count from 12 to 20",
    "json for erin, age 54, from lima", "write add for 5 and 5", "repeat \"token\" 6 times", "spell banana",
    "list 4 fruits", "tell me about the cat",
]  # fmt: skip


# seeded sampled prompts (the quick start's file): the reference engine draws one sample per committed token from
# the seed's generator, so tree mode must return the baseline's tokens for them too
SAMPLED_PROMPTS_FILE = Path(__file__).resolve().parents[2] / "inventory" / "lab-seeded-prompts.yaml"


def _tiny_prompts(folder: Path) -> Path:
    import yaml

    path = folder / "prompts.yaml"
    items: list[dict[str, object]] = [
        {"id": f"p{i}", "prompt": p, "max_tokens": 48} for i, p in enumerate(TINY_PROMPTS)
    ]
    items += yaml.safe_load(SAMPLED_PROMPTS_FILE.read_text())["prompts"]
    path.write_text(yaml.safe_dump({"prompts": items}))
    return path


def _ok(result, what: str) -> str:
    assert result.returncode == 0, (
        f"{what} exited {result.returncode}:\n{result.stderr[-4000:]}\n{result.stdout[-2000:]}"
    )
    return result.stderr


def test_journey(journey_inventory: Path) -> None:
    inv = str(journey_inventory)
    err = _ok(opsctl("deploy", "-i", inv, "--service", "ref", "--mode", "shadow"), "deploy --mode shadow")
    # An earlier lab module may have left this very shadow release live: then nothing is restarted.
    assert all(f"{h}/ref: deployed" in err or f"{h}/ref: unchanged" in err for h in ("lab1", "lab2")), err
    _ok(opsctl("deploy", "-i", inv, "--service", "base"), "deploy baseline")
    assert current_mode(journey_inventory, "lab1", "ref") == "shadow"

    smoke = opsctl("smoke", "-i", inv, "--json")
    _ok(smoke, "smoke")
    results = json.loads(smoke.stdout)
    assert {(r["host"], r["service"]) for r in results} == {("lab1", "ref"), ("lab1", "base"), ("lab2", "ref")}
    assert all(r["ok"] and r["completion_tokens"] > 0 and r["finish_reason"] in ("stop", "length") for r in results)

    err = _ok(opsctl("deploy", "-i", inv, "--service", "ref", "--mode", "tree"), "deploy --mode tree")
    assert "lab1/ref: deployed" in err and "lab2/ref: deployed" in err
    assert current_mode(journey_inventory, "lab2", "ref") == "tree"

    eq = opsctl(
        "smoke", "-i", inv, "--service", "ref", "--equivalence", "--baseline", "lab1/base",
        "--prompts", str(_tiny_prompts(journey_inventory.parent)), "--json",
    )  # fmt: skip
    _ok(eq, "smoke --equivalence")
    reports = json.loads(eq.stdout)
    assert len(reports) == 2
    for report in reports:
        assert report["passed"] and report["agreement"] == 1.0 and len(report["prompts"]) == len(TINY_PROMPTS) + 2
        assert all(p["equal"] and p["first_divergence"] is None for p in report["prompts"])

    logs = opsctl("logs", "-i", inv, "ref", "--metrics", "--json")
    _ok(logs, "logs --metrics")
    data = json.loads(logs.stdout)
    for label in ("lab1/ref", "lab2/ref"):
        summary = data["summary"][label]
        assert summary["init"]["mode"] == "tree"
        assert summary["last_metrics"]["tau"] > 1.0, summary  # the distilled tiny drafter really accepts tokens

    status = opsctl("status", "-i", inv, "--json")
    _ok(status, "status")
    rows = {(r["host"], r["service"]): r for r in json.loads(status.stdout)["services"]}
    assert rows[("lab1", "ref")]["mode"] == "tree" and rows[("lab1", "ref")]["healthy"]
    assert rows[("lab1", "ref")]["unit"]["active_state"] == "active"
    assert rows[("lab1", "ref")]["last_metrics"]["tau"] > 1.0
    # what `opsctl rollback` will restore: the shadow release the tree release replaced
    rollback_to = rows[("lab1", "ref")]["rollback_to"]
    assert rollback_to is not None and rollback_to != rows[("lab1", "ref")]["current"]

    err = _ok(opsctl("rollback", "-i", inv, "ref"), "rollback")
    assert "rolled back to" in err
    for host in ("lab1", "lab2"):
        assert current_mode(journey_inventory, host, "ref") == "shadow"
    assert current_release(journey_inventory, "lab1", "ref") == rollback_to
    status = json.loads(opsctl("status", "-i", inv, "--service", "ref", "--json").stdout)
    assert all(r["healthy"] and r["mode"] == "shadow" for r in status["services"])
