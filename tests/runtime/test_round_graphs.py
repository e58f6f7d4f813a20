"""ddtree.sglang.round_graphs: the tree worker's plan + commit replayed from CUDA graphs per batch size equal the
eager plan_batch / commit_batch, round after round with new inputs (CUDA only), and stay off elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from ddtree.sglang.batch_round import commit_batch, plan_batch
from ddtree.sglang.devcheck import random_path_verify
from ddtree.sglang.round_graphs import RoundGraphs, clone_result
from ddtree.sglang.tree_round import plan_round

pytestmark = pytest.mark.runtime

SLOTS, BUDGET, TOPK, VOCAB = 8, 7, 8, 3000


def round_inputs(seed: int, bs: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(bs, SLOTS - 1, VOCAB, generator=g) * 3).log_softmax(-1)
    roots, prefixes = torch.randint(0, VOCAB, (bs,), generator=g), torch.randint(1, 500, (bs,), generator=g)
    return lp.to(device), roots.to(device), prefixes.to(device)


def test_graphs_apply_to_small_cuda_batches_only() -> None:
    graphs = RoundGraphs(SLOTS, BUDGET, TOPK, max_batch=8)
    assert not graphs.applies(1, torch.device("cpu"))
    assert graphs.applies(8, torch.device("cuda")) and not graphs.applies(9, torch.device("cuda"))
    assert not RoundGraphs(SLOTS, BUDGET, TOPK, max_batch=0).applies(1, torch.device("cuda"))


def test_warm_runs_plan_and_commit_on_the_cpu_without_graphs() -> None:
    graphs = RoundGraphs(SLOTS, BUDGET, TOPK, max_batch=8)
    graphs.warm([1, 2, 9], SLOTS - 1, VOCAB, torch.device("cpu"))  # eager there: shapes valid, nothing captured
    assert not graphs._plans and not graphs._commits


def test_clone_result_copies_every_tensor() -> None:
    @dataclass(frozen=True)
    class Result:
        a: torch.Tensor
        n: int

    value = Result(a=torch.arange(3), n=4)
    copy = clone_result(value)
    value.a.zero_()
    assert copy.a.tolist() == [0, 1, 2] and copy.n == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replayed_rounds_equal_eager_rounds() -> None:
    device = torch.device("cuda")
    graphs = RoundGraphs(SLOTS, BUDGET, TOPK)
    graphs.warm([1, 3, 9], SLOTS - 1, VOCAB, device)  # start-up: captures 1 and 3 on dummy inputs, 9 eager
    assert sorted(key[0] for key in graphs._plans) == [1, 3]
    for seed, bs in [(1, 3), (2, 1), (3, 3), (4, 8), (5, 1)]:  # captures for 3, 1, 8; replays with new inputs
        lp, roots, prefixes = round_inputs(seed, bs, device)
        ref = plan_round(lp.cpu(), roots.tolist(), prefixes.tolist(), SLOTS, BUDGET, TOPK)
        index, num, predict = (t.to(device) for t in random_path_verify(ref, VOCAB, seed))
        want_plan = plan_batch(lp, roots, prefixes, SLOTS, BUDGET, TOPK)
        want = commit_batch(want_plan, index, num, predict)
        plan = graphs.plan(lp, roots, prefixes)
        for name in ("tokens", "positions", "tree_mask", "retrieve_next_token", "retrieve_next_sibling"):
            assert torch.equal(getattr(plan, name), getattr(want_plan, name)), (seed, name)
        got = clone_result(graphs.commit(plan, index, num, predict))
        for name in ("out_tokens", "commit_lens", "bonus", "perm", "off_spine", "bad_path"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (seed, name)
        assert not got.bad_path.any()
