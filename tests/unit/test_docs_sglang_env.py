"""docs/sglang.md says one thing about SGLANG_DFLASH_EAGER_DRAFT_SAMPLER, and it is what render.py renders
(the doc said "not needed" for tree services in one place while tree services render it)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from opsctl.inventory.load import _policy, load_inventory
from opsctl.render import server_env

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"
VAR = "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER"


def test_rendered_for_sglang_shadow_and_tree_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    host = load_inventory(GOLDEN).hosts[0]
    rendered = {svc.name: dict(server_env(host, svc, "/r")).get(VAR) for svc in host.services}
    assert host.service("sgl-tree").ddtree.policy.text == "auto"  # the golden tree runs the policy: no eager head
    assert {name for name, value in rendered.items() if value == "1"} == {"sgl-shadow"}


def test_the_doc_agrees() -> None:
    text = " ".join((ROOT / "docs" / "sglang.md").read_text().split())
    sentences = [s for s in re.split(r"(?<=[.;:)])\s", text) if "eager-sampler" in s or VAR in s]
    assert sentences and not [s for s in sentences if "not needed" in s], "the doc says the variable is not needed"
    rule = "rendered for every `sglang` service in `shadow` or `tree` mode, except tree services whose `ddtree.policy`"
    assert f"`{VAR}=1`, {rule} is `auto` or `chain`" in text


@pytest.mark.parametrize(("policy", "eager"), [("off", True), ("tree8", True), ("auto", False), ("chain", False)])
def test_tree_services_whose_policy_runs_chain_rounds_keep_the_head_in_the_graph(
    monkeypatch: pytest.MonkeyPatch, policy: str, eager: bool
) -> None:
    monkeypatch.setenv("OPSCTL_GOLDEN_KEY", "k")
    host = load_inventory(GOLDEN).hosts[0]
    tree = host.service("sgl-tree")
    knobs = dataclasses.replace(tree.ddtree, policy=_policy(policy, "p", tree.ddtree.budget))
    env = dict(server_env(host, dataclasses.replace(tree, ddtree=knobs), "/r"))
    assert (env.get(VAR) == "1") is eager
    assert env.get("DDTREE_POLICY", "off") == policy
