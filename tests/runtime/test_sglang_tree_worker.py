"""ddtree.sglang.tree_round (the tree worker's pure parts, no SGLang): the round's verify inputs from the
drafter's log-probs, and the commit from verify_tree_greedy's outputs, checked against ddtree.tree's own build
and walk."""

from __future__ import annotations

import pytest
import torch
from ddtree.sglang.devcheck import VOCAB, path_logits
from ddtree.sglang.layout import accept_tensors, full_mask, greedy_accept
from ddtree.sglang.tree_round import (
    TreeCommit,
    TreeRound,
    commit_round,
    folded_draft_head_warning,
    hybrid_tree_refusal,
    plan_round,
    verify_slots,
)
from ddtree.stats import RoundStats, round_stats
from ddtree.tree import build_tree_heap, compile_tree, is_off_spine, tree_shape, walk_tree

pytestmark = pytest.mark.runtime

SLOTS = 8  # block size: the verify window per request


def tree_stats(plan: TreeRound, commit: TreeCommit, times_ms: dict[str, float]) -> list[RoundStats]:
    """`ddtree.stats.round_stats` of a host reference round: each request's path, tree shape and spine."""
    shapes = [tree_shape(tree) for tree in plan.trees]
    return round_stats([len(path) for path in commit.paths], shapes, commit.off_spine, times_ms)


def draft_logprobs(seed: int, bs: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(bs, SLOTS - 1, VOCAB, generator=g) * 2).log_softmax(-1)  # [bs, B - 1, V]


@pytest.mark.parametrize(("budget", "topk"), [(1, 1), (7, 1), (7, 3), (5, 4)])
def test_plan_round_builds_the_trees_in_sglang_shapes(budget: int, topk: int) -> None:
    lp = draft_logprobs(seed=budget * 10 + topk, bs=3)
    roots, prefixes = [5, 9, 1], [11, 4, 30]
    plan = plan_round(lp, roots, prefixes, SLOTS, budget, topk)
    assert plan.tokens.shape == (3, SLOTS)
    assert plan.positions.shape == (3 * SLOTS,)
    assert plan.custom_mask.shape == (sum(SLOTS * (p + SLOTS) for p in prefixes),)
    assert torch.equal(plan.custom_mask, full_mask(plan.layouts, prefixes))
    assert plan.retrieve_index.tolist() == [[b * SLOTS + i for i in range(SLOTS)] for b in range(3)]
    for b in range(3):
        ref = build_tree_heap(lp[b], root_token=roots[b], budget=budget, topk=topk)
        tree, lay = plan.trees[b], plan.layouts[b]
        assert torch.equal(tree.tokens, ref.tokens) and torch.equal(tree.parents, ref.parents)
        assert plan.tokens[b, 0] == roots[b]
        inputs = compile_tree(tree, prefixes[b])
        n = tree.num_nodes
        assert torch.equal(plan.tokens[b, :n], inputs.input_ids[lay.order])
        assert torch.equal(plan.positions[b * SLOTS : b * SLOTS + n], inputs.position_ids[lay.order])


def test_plan_round_refuses_a_budget_beyond_the_window() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        plan_round(draft_logprobs(0, 1), [0], [3], SLOTS, budget=SLOTS, topk=2)


def test_commit_round_matches_walk_tree_including_off_spine() -> None:
    off_spine = deeper = 0
    for seed in range(12):
        bs = 1 + seed % 3
        lp = draft_logprobs(seed, bs)
        plan = plan_round(lp, list(range(bs)), [7 + b for b in range(bs)], SLOTS, budget=7, topk=3)
        logits = [path_logits(tree, seed=100 * seed + b) for b, tree in enumerate(plan.trees)]
        predict = torch.zeros((bs, SLOTS), dtype=torch.int64)
        for b, lay in enumerate(plan.layouts):
            predict[b, : lay.num_nodes] = logits[b].argmax(-1)[lay.order]
        accepts = [greedy_accept(lay, predict[b]) for b, lay in enumerate(plan.layouts)]
        index, num, _ = accept_tensors(accepts, list(predict), SLOTS, SLOTS)
        commit = commit_round(plan, index, num, predict)
        for b, tree in enumerate(plan.trees):
            ref = walk_tree(tree, logits[b])
            lay = plan.layouts[b]
            path = commit.paths[b]
            assert tuple(lay.order[path].tolist()) == ref.accepted
            tau = len(ref.accepted)
            assert int(commit.commit_lens[b]) == tau
            want = [*tree.tokens[list(ref.accepted[1:])].tolist(), ref.bonus_token]
            assert commit.out_tokens[b, :tau].tolist() == want
            assert int(commit.bonus[b]) == ref.bonus_token
            assert commit.perm[b, :tau].tolist() == path
            assert sorted(commit.perm[b].tolist()) == list(range(SLOTS))
            assert commit.off_spine[b] == is_off_spine(tree, ref.accepted)
            off_spine += commit.off_spine[b]
            deeper += tau > 2
        stats = tree_stats(plan, commit, {"verify": 3.0})
        assert [s.accepted_len for s in stats] == commit.commit_lens.tolist()
        assert sum(s.verify_ms for s in stats) == pytest.approx(3.0)
    assert off_spine >= 3 and deeper >= 3


def test_commit_round_rejects_a_path_through_padding() -> None:
    plan = plan_round(draft_logprobs(1, 1), [0], [5], SLOTS, budget=2, topk=1)  # 3 real nodes, 5 padding
    index = torch.tensor([[0, 5, -1, -1, -1, -1, -1, -1]])
    with pytest.raises(RuntimeError, match="bad path"):
        commit_round(plan, index, torch.tensor([1]), torch.zeros((1, SLOTS), dtype=torch.int64))


class GDNAttnBackend:  # named as SGLang's GDN backend class; only its name and `topk` are read
    topk = 0


class Pool:
    def __init__(self, **flags: object) -> None:
        self.__dict__.update(flags)


def test_hybrid_tree_refusal_names_what_blocks_the_exact_path() -> None:
    assert hybrid_tree_refusal(GDNAttnBackend(), Pool(replayssm_spec_fold=False)) == ""
    assert hybrid_tree_refusal(GDNAttnBackend(), None) == ""  # CUDA graphs or not (ddtree.sglang.hybrid_graphs)
    assert "ReplaySSM" in hybrid_tree_refusal(GDNAttnBackend(), Pool(replayssm_spec_fold=True))
    assert "ReplaySSM" in hybrid_tree_refusal(GDNAttnBackend(), Pool(replayssm_cache_base=3))
    assert "KDAAttnBackend" in hybrid_tree_refusal(type("KDAAttnBackend", (), {"topk": 0})(), None)


def test_verify_slots_widen_to_dflash_reservation_then_refuse() -> None:
    assert [verify_slots(b, 8) for b in (1, 7, 8, 15)] == [8, 8, 16, 16]
    with pytest.raises(ValueError, match=r"DDTREE_BUDGET=16 is too large .* \(DDTREE_BUDGET <= 15\)"):
        verify_slots(16, 8)


def test_plan_round_in_a_wide_window_keeps_depth_within_the_block() -> None:
    lp = draft_logprobs(seed=3, bs=2)
    plan = plan_round(lp, [5, 9], [11, 4], 2 * SLOTS, budget=2 * SLOTS - 1, topk=8)
    assert plan.tokens.shape == (2, 2 * SLOTS)
    for tree in plan.trees:
        assert tree.num_nodes == 2 * SLOTS  # the root and 15 nodes: more than one block
        assert int(tree.depths.max()) <= SLOTS - 1  # what a round commits (tau <= depth + 1) fits one block


def test_a_folded_draft_head_is_named_with_the_variable_that_leaves_it_out() -> None:
    assert folded_draft_head_warning(None) == ""  # eager sampler, or no drafter CUDA graphs
    assert folded_draft_head_warning(object(), runs_chain_rounds=True) == ""  # a policy's chain rounds read it
    warning = folded_draft_head_warning(object())  # SGLang's _DflashDraftSampler, captured with the drafter
    assert "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1" in warning and "unused" in warning
