"""ddtree.batch_tree: the batched, device-resident build equals build_tree_heap request by request (ids, tokens,
parents, depths, scores), ties included, and its pieces (tie-exact row top-k, first-True scan, BFS slot keys)
equal their plain references."""

from __future__ import annotations

import ddtree.tree
import pytest
import torch
from ddtree.batch_tree import (
    ancestor_masks,
    batch_row_topk,
    bfs_slot_order,
    build_trees_batched,
    first_true,
    level_sizes,
    tree_nodes,
)
from ddtree.sglang.layout import bfs_order
from ddtree.tree import ancestor_mask, build_tree_heap, build_tree_reference, depth_groups
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tree_inputs import KINDS, batch_logprobs, make_logprobs

pytestmark = pytest.mark.runtime

FIELDS = ("tokens", "parents", "depths", "scores")
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same_as_heap(lp: torch.Tensor, roots: torch.Tensor, budget: int, topk: int) -> None:
    trees = build_trees_batched(lp, roots, budget, topk)
    assert trees.num_nodes == tree_nodes(lp.shape[1], budget, topk, lp.shape[2])
    for b in range(lp.shape[0]):
        ref = build_tree_heap(lp[b], int(roots[b]), budget, topk)
        got = trees.tree(b)
        for field in FIELDS:
            x, y = getattr(ref, field), getattr(got, field)
            assert x.dtype == y.dtype, field
            assert torch.equal(x, y), f"request {b} {field}: {x.tolist()} != {y.tolist()}"
    # SGLang's BFS slot order (depth, parent slot, id) and the ancestor masks, all trees at once
    ancestors = ancestor_masks(trees.parents)
    order = bfs_slot_order(trees.parents, trees.depths, ancestors)
    for b in range(lp.shape[0]):
        ref = build_tree_heap(lp[b], int(roots[b]), budget, topk)
        assert torch.equal(order[b], bfs_order(ref.parents, ref.depths))
        assert torch.equal(ancestors[b], ancestor_mask(ref.parents, depth_groups(ref.depths)))


@PROPERTY
@given(
    seed=st.integers(0, 2**31 - 1),
    bs=st.integers(1, 4),
    rows=st.integers(1, 15),
    vocab=st.integers(1, 40),
    budget=st.integers(1, 64),
    topk=st.integers(1, 16),
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4),
)
def test_batched_build_equals_heap(
    seed: int, bs: int, rows: int, vocab: int, budget: int, topk: int, kinds: list[str]
) -> None:
    lp = batch_logprobs(seed, bs, rows, vocab, kinds)
    roots = torch.randint(0, vocab, (bs,), generator=torch.Generator().manual_seed(seed))
    assert_same_as_heap(lp, roots, budget, topk)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("budget", "topk"), [(1, 1), (1, 8), (15, 8), (31, 8), (7, 3)])
def test_batched_build_at_sglang_shapes(kind: str, budget: int, topk: int) -> None:
    """Block 16 (15 rows), a vocabulary of several tie-scan chunks; budget 15 = block - 1, 31 = a wide tree."""
    lp = batch_logprobs(budget * 31 + topk, 3, 15, 1000, [kind])
    assert_same_as_heap(lp, torch.tensor([3, 999, 0]), budget, topk)


def test_batched_build_equals_the_plain_reference_on_ties() -> None:
    lp = batch_logprobs(5, 2, 6, 30, ["quantized", "uniform"])
    trees = build_trees_batched(lp, torch.tensor([1, 2]), 20, 5)
    for b in range(2):
        ref = build_tree_reference(lp[b], b + 1, 20, 5)
        assert all(torch.equal(getattr(ref, f), getattr(trees.tree(b), f)) for f in FIELDS)


def test_budget_zero_is_the_root_alone() -> None:
    trees = build_trees_batched(torch.zeros(2, 3, 5), torch.tensor([4, 1]), 0, 2)
    assert trees.tokens.tolist() == [[4], [1]] and trees.parents.tolist() == [[-1], [-1]]


def test_level_sizes_and_node_count() -> None:
    assert level_sizes(15, 15, 8, 248320) == [8, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15]
    assert tree_nodes(15, 15, 8, 248320) == 16
    assert level_sizes(3, 100, 2, 10) == [2, 4, 8] and tree_nodes(3, 100, 2, 10) == 15
    assert level_sizes(4, 2, 8, 1) == [1, 1] and tree_nodes(4, 2, 8, 1) == 3  # vocabulary 1: a chain


@PROPERTY
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 5),
    vocab=st.integers(1, 600),
    topk=st.integers(1, 16),
    kind=st.sampled_from(KINDS),
)
def test_batch_row_topk_equals_plain_sort(seed: int, rows: int, vocab: int, topk: int, kind: str) -> None:
    lp = make_logprobs(seed, rows, vocab, kind)
    k = min(topk, vocab)
    vals, ids = batch_row_topk(lp, k)
    host_vals, host_ids = ddtree.tree.row_topk(lp, k)
    assert torch.equal(ids, host_ids) and torch.equal(vals, host_vals)
    for r in range(rows):
        ref_vals, ref_ids = ddtree.tree._row_topk_reference(lp[r], k)
        assert ids[r].tolist() == ref_ids and vals[r].tolist() == ref_vals


@PROPERTY
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 4),
    vocab=st.integers(1, 80),
    count=st.integers(1, 10),
    chunk=st.integers(1, 20),
    density=st.floats(0.0, 1.0),
)
def test_first_true_equals_nonzero(seed: int, rows: int, vocab: int, count: int, chunk: int, density: float) -> None:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, vocab, generator=g) < density
    got = first_true(mask, count, chunk=chunk)
    for r in range(rows):
        want = torch.nonzero(mask[r]).flatten().tolist()[:count]
        assert got[r].tolist() == want + [vocab] * (count - len(want))


def test_ties_cut_past_the_first_chunk_take_the_smallest_ids() -> None:
    """Large vocabulary, the k-th value tied by tokens spread over many chunks: the smallest ids win."""
    vocab = 5000
    lp = torch.full((2, vocab), -20.0)
    lp[0, [4000, 17, 2600]] = -0.5
    lp[0, [4999, 1200, 300, 3000, 280]] = -2.0  # 3 above the cut; the cut value -2.0 tied 5 times
    lp[1, 4321] = -0.1  # then every other token ties at -20.0
    vals, ids = batch_row_topk(lp, 5)
    assert ids.tolist() == [[17, 2600, 4000, 280, 300], [4321, 0, 1, 2, 3]]
    assert vals[0].tolist() == [-0.5, -0.5, -0.5, -2.0, -2.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_batched_build_equals_cpu_heap(kind: str) -> None:
    lp = batch_logprobs(11, 8, 15, 248320 if kind == "continuous" else 3000, [kind])
    roots = torch.arange(8)
    trees = build_trees_batched(lp.cuda(), roots.cuda(), 15, 8)
    for b in range(8):
        ref = build_tree_heap(lp[b], b, 15, 8)
        assert all(torch.equal(getattr(ref, f), getattr(trees.tree(b), f).cpu()) for f in FIELDS)
