"""ddtree.sglang.bench_hooks: production rounds get hooks that hand every input back unchanged; a recording run's
hooks write the paths the round committed and the scores its trees were planned from, and a replay of that file
imposes those scores and steers the walk exactly as `ddtree.sglang.replay`'s own functions do."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from ddtree.config import DDTreeConfig
from ddtree.sglang.batch_round import commit_batch, plan_batch
from ddtree.sglang.bench_hooks import BenchmarkHooks, RoundHooks, SpineDemotion
from ddtree.sglang.devcheck import random_path_verify
from ddtree.sglang.replay import ReplayFormatError, impose_topk, steer_predictions
from ddtree.sglang.tree_round import plan_round

pytestmark = pytest.mark.runtime

BLOCK, VOCAB, BUDGET, TOPK = 6, 40, 5, 3
BATCH = SimpleNamespace(reqs=[SimpleNamespace(rid="a"), SimpleNamespace(rid="b")])


def scores(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, BLOCK - 1, VOCAB, generator=g) * 3).log_softmax(-1)  # [bs, B - 1, V]


def round_plan(lp: torch.Tensor) -> tuple[object, object]:
    roots, prefixes = torch.tensor([3, 7]), torch.tensor([5, 9])
    ref = plan_round(lp, roots.tolist(), prefixes.tolist(), BLOCK, BUDGET, TOPK)
    return ref, plan_batch(lp, roots, prefixes, BLOCK, BUDGET, TOPK)


def test_production_hooks_hand_every_input_back() -> None:
    hooks = RoundHooks.build(DDTreeConfig(budget=BUDGET, topk=TOPK), BLOCK, VOCAB)
    assert type(hooks) is RoundHooks
    lp = scores(0)
    _, plan = round_plan(lp)
    predict = torch.zeros(2, BLOCK, dtype=torch.int64)
    assert hooks.planning(BATCH, lp, gathered=False) is lp
    assert hooks.steer(plan, predict) is predict


def test_a_recording_replays_its_shapes_and_paths(tmp_path: Path) -> None:
    out = tmp_path / "paths.json"
    recording = RoundHooks.build(DDTreeConfig(budget=BUDGET, topk=TOPK, record_paths=str(out)), BLOCK, VOCAB)
    assert isinstance(recording, BenchmarkHooks) and recording.paths is not None
    lp = scores(1)
    ref, plan = round_plan(lp)
    assert recording.planning(BATCH, lp, gathered=False) is lp  # a recording changes nothing
    index, num, predict = random_path_verify(ref, VOCAB, seed=5)
    assert recording.steer(plan, predict) is predict
    commit = commit_batch(plan, index, num, predict)
    recording.committed(BATCH, plan, commit)
    recording.paths.write()
    recorded = json.loads(out.read_text())["requests"]
    want_topk = lp.topk(TOPK, dim=-1).values
    for b, rounds in enumerate(recorded):
        path = [slot for slot in commit.path[b].tolist() if slot >= 0]
        assert len(rounds) == 1 and len(rounds[0]["path"]) == len(path) - 1  # one rank per accepted draft
        assert torch.allclose(torch.tensor(rounds[0]["topk"]), want_topk[b], atol=1e-4)

    replaying = RoundHooks.build(DDTreeConfig(budget=BUDGET, topk=TOPK, replay_acceptance=str(out)), BLOCK, VOCAB)
    flat = torch.zeros(2, BLOCK - 1, VOCAB)  # a random-weight drafter's flat scores
    imposed = replaying.planning(BATCH, flat.clone(), gathered=False)
    expected = flat.clone()
    impose_topk(expected, torch.tensor([rounds[0]["topk"] for rounds in recorded]))
    assert torch.equal(imposed, expected)
    _, replan = round_plan(imposed)
    target = torch.zeros(2, BLOCK, dtype=torch.int64)
    steered = replaying.steer(replan, target)
    ranks = [rounds[0]["path"] for rounds in recorded]
    want, _ = steer_predictions(
        replan.tokens, replan.retrieve_next_token, replan.retrieve_next_sibling, target, ranks, VOCAB
    )
    assert torch.equal(steered, want) and not torch.equal(steered, target)


def test_a_replay_of_another_drafters_shape_is_refused_at_start(tmp_path: Path) -> None:
    out = tmp_path / "paths.json"
    out.write_text(json.dumps({"format": "ddtree-paths/2", "requests": [[{"path": [0], "topk": [[-0.1, -2.0]]}]]}))
    with pytest.raises(ReplayFormatError, match="recorded top-k tables are 1 x 2, this drafter's are 5 x 3"):
        RoundHooks.build(DDTreeConfig(budget=BUDGET, topk=TOPK, replay_acceptance=str(out)), BLOCK, VOCAB)


def test_spine_demotion_plans_from_the_drafter_second_choice_with_the_first_a_sibling() -> None:
    """DDTREE_TEST_DEMOTE_SPINE: the first depth's two best scores swap places (nothing else changes), so the
    tree's spine starts with the drafter's second choice and its first choice is a sibling: a target that agrees
    with the drafter accepts off the spine, whatever the tiny model's build."""
    hooks = RoundHooks.build(DDTreeConfig(budget=BUDGET, topk=TOPK, test_demote_spine=True), BLOCK, VOCAB)
    assert isinstance(hooks, SpineDemotion)
    lp = scores(3)
    before = lp.clone()
    demoted = hooks.planning(BATCH, lp, gathered=False)
    assert torch.equal(lp, before)  # the drafter's scores are not written to
    first, second = before[:, 0].topk(2, dim=-1).indices.unbind(-1)  # [bs] each
    rows = torch.arange(2)
    assert torch.equal(demoted[rows, 0, first], before[rows, 0, second])
    assert torch.equal(demoted[rows, 0, second], before[rows, 0, first])
    untouched = torch.ones_like(before, dtype=torch.bool)
    untouched[rows, 0, first] = untouched[rows, 0, second] = False
    assert torch.equal(demoted[untouched], before[untouched])
    _, plan = round_plan(demoted)
    for b in range(2):
        spine = int(plan.retrieve_next_token[b, 0])
        assert int(plan.tokens[b, spine]) == int(second[b])
        sibling = int(plan.retrieve_next_sibling[b, spine])
        assert sibling > 0 and int(plan.tokens[b, sibling]) == int(first[b])
    gathered = before[..., :TOPK]
    assert hooks.planning(BATCH, gathered, gathered=True) is gathered  # a sharded head's top-k keeps its order


def test_spine_demotion_is_a_test_knob_production_never_renders() -> None:
    assert DDTreeConfig.from_env({"DDTREE_TEST_DEMOTE_SPINE": "1"}).test_demote_spine
    assert not DDTreeConfig.from_env({}).test_demote_spine
    assert "DDTREE_TEST_DEMOTE_SPINE" not in DDTreeConfig().to_env()
    on = DDTreeConfig(test_demote_spine=True)
    assert DDTreeConfig.from_env(on.to_env()) == on
    with pytest.raises(ValueError, match="DDTREE_TEST_DEMOTE_SPINE"):
        DDTreeConfig.from_env({"DDTREE_TEST_DEMOTE_SPINE": "maybe"})


@pytest.mark.parametrize("hook", ["DDTREE_REPLAY_ACCEPTANCE", "DDTREE_RECORD_PATHS"])
def test_spine_demotion_refuses_a_replay_or_recording_it_would_silently_replace(hook: str) -> None:
    with pytest.raises(ValueError, match=f"DDTREE_TEST_DEMOTE_SPINE=1 cannot be combined with {hook}"):
        DDTreeConfig.from_env({"DDTREE_TEST_DEMOTE_SPINE": "1", hook: "/tmp/paths.json"})
    assert DDTreeConfig.from_env({"DDTREE_TEST_DEMOTE_SPINE": "0", hook: "/tmp/paths.json"}).test_demote_spine is False
