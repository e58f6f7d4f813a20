"""ddtree.tree: build parity (heap vs vectorized), budget semantics, ancestor mask, acceptance walk."""

from __future__ import annotations

import ddtree.tree
import pytest
import torch
from ddtree.tree import (
    DraftTree,
    ancestor_mask,
    build_tree,
    build_tree_heap,
    build_tree_reference,
    compile_tree,
    depth_groups,
    is_off_spine,
    sample_token,
    spine_tree,
    tree_shape,
    walk_tree,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tree_inputs import KINDS, make_logprobs

pytestmark = pytest.mark.runtime

FIELDS = ("tokens", "parents", "depths", "scores")
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same_tree(a: DraftTree, b: DraftTree) -> None:
    for field in FIELDS:
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype, field
        assert torch.equal(x, y), f"{field}: {x.tolist()} != {y.tolist()}"


def assert_well_formed(tree: DraftTree, lp: torch.Tensor, budget: int, topk: int) -> None:
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    depths, scores = tree.depths.tolist(), tree.scores.tolist()
    rows, vocab = lp.shape
    k = min(topk, vocab)
    reachable = sum(k**d for d in range(1, rows + 1))
    assert tree.num_nodes == 1 + min(budget, reachable)  # the budget is always used when nodes exist
    assert parents[0] == -1 and depths[0] == 0 and scores[0] == 0.0
    siblings: dict[int, set[int]] = {}
    for i in range(1, tree.num_nodes):
        p = parents[i]
        assert 0 <= p < i
        assert depths[i] == depths[p] + 1 <= rows
        expected = torch.tensor(scores[p], dtype=torch.float32) + lp[depths[i] - 1, tokens[i]]
        assert scores[i] == expected.item()
        assert scores[i] <= scores[i - 1]  # pop order: scores never increase
        assert tokens[i] not in siblings.setdefault(p, set())
        siblings[p].add(tokens[i])


# --------------------------------------------------------------------------------------- build


@PROPERTY
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 15),
    vocab=st.integers(1, 40),
    budget=st.integers(1, 300),
    topk=st.integers(1, 16),
    kind=st.sampled_from(KINDS),
)
def test_vectorized_build_equals_heap(seed: int, rows: int, vocab: int, budget: int, topk: int, kind: str):
    lp = make_logprobs(seed, rows, vocab, kind)
    ref = build_tree_reference(lp, 7, budget, topk)
    vec = build_tree(lp, 7, budget, topk)
    assert_same_tree(ref, vec)
    assert_same_tree(ref, build_tree_heap(lp, 7, budget, topk))
    assert_well_formed(vec, lp, budget, topk)


@PROPERTY
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 6),
    vocab=st.integers(1, 40),
    topk=st.integers(1, 16),
    kind=st.sampled_from(KINDS),
)
def test_row_topk_equals_plain_sort(seed: int, rows: int, vocab: int, topk: int, kind: str):
    lp = make_logprobs(seed, rows, vocab, kind)
    k = min(topk, vocab)
    vals, ids = ddtree.tree.row_topk(lp, k)
    for r in range(rows):
        ref_vals, ref_ids = ddtree.tree._row_topk_reference(lp[r], k)
        assert ids[r].tolist() == ref_ids
        assert vals[r].tolist() == ref_vals


def test_hand_computed_tree_and_tie_break():
    # Row 0: tokens 1 and 2 tie at log(0.4), token 0 at log(0.2). Row 1: token 0 has log-prob 0 (certain).
    lp = torch.tensor([[0.2, 0.4, 0.4], [1.0, 0.0, 0.0]]).log()
    tree = build_tree(lp, root_token=9, budget=4, topk=2)
    # Pops: token 1 (rank 0: equal log-probs -> smaller id); then token 2 (its sibling) and token 1's child
    # token 0 tie on score, depth 1 < 2 wins; then the two depth-2 children tie, parent id 1 < 2 wins.
    assert tree.tokens.tolist() == [9, 1, 2, 0, 0]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 2]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2]
    assert_same_tree(tree, build_tree_reference(lp, 9, 4, 2))


def test_zero_logprob_child_ties_with_parent_and_comes_after_it():
    lp = torch.tensor([[-1.0, -2.0], [0.0, float("-inf")]])
    tree = build_tree(lp, 5, budget=3, topk=2)
    # Node 1 (token 0, score -1) and its child (score -1 + 0 = -1) tie; the parent pops first, then the
    # child (score -1) beats token 1 at depth 1 (score -2).
    assert tree.tokens.tolist() == [5, 0, 0, 1]
    assert tree.parents.tolist() == [-1, 0, 1, 0]
    assert tree.scores.tolist() == [0.0, -1.0, -1.0, -2.0]


@pytest.mark.parametrize("rows", [1, 5, 15])
def test_budget_at_most_depth_with_topk_1_is_a_chain(rows: int):
    lp = make_logprobs(0, rows, 50, "continuous")
    for budget in range(1, rows + 1):
        tree = build_tree(lp, 3, budget, topk=1)
        assert tree.parents.tolist() == list(range(-1, budget))
        assert tree.depths.tolist() == list(range(budget + 1))
        assert tree_shape(tree).width == 1
        assert_same_tree(tree, spine_tree(lp, 3, budget))


def test_depth_never_exceeds_rows_and_nodes_never_exceed_budget():
    lp = make_logprobs(1, 15, 151, "continuous")
    for budget in (1, 16, 64, 256, 512):
        for topk in (1, 4, 16):
            tree = build_tree(lp, 0, budget, topk)
            shape = tree_shape(tree)
            assert shape.depth <= 15
            assert tree.num_nodes == 1 + (min(budget, 15) if topk == 1 else budget)
            assert shape.nodes == tree.num_nodes - 1


def test_topk_caps_width_per_parent():
    lp = make_logprobs(2, 3, 100, "continuous")
    tree = build_tree(lp, 0, budget=300, topk=3)
    counts = torch.bincount(tree.parents[1:], minlength=tree.num_nodes)
    assert int(counts.max()) == 3
    assert tree.num_nodes == 1 + 3 + 9 + 27  # every node of the full 3-ary tree of depth 3


def test_spine_is_the_argmax_chain_and_the_first_children_of_the_tree():
    lp = make_logprobs(3, 6, 80, "continuous")
    spine = spine_tree(lp, 11, 6)
    assert spine.tokens.tolist() == [11, *lp.argmax(-1).tolist()]
    tree = build_tree(lp, 11, budget=300, topk=4)
    first_child_path = [0]
    for node in range(1, tree.num_nodes):
        if int(tree.parents[node]) == first_child_path[-1]:
            first_child_path.append(node)
    assert tree.tokens[first_child_path].tolist() == spine.tokens.tolist()  # the whole spine is in the tree
    assert not is_off_spine(tree, tuple(first_child_path))
    assert is_off_spine(tree, (0, first_child_path[1] + 1))  # the second child of the root


def test_budget_zero_and_zero_rows_give_the_root_only():
    lp = make_logprobs(0, 4, 10, "continuous")
    trees = [builder(lp, 4, 0, 8) for builder in (build_tree, build_tree_reference, build_tree_heap)]
    for tree in [*trees, build_tree(lp[:0], 4, 32, 8), build_tree_heap(lp[:0], 4, 32, 8)]:
        assert tree.tokens.tolist() == [4] and tree.parents.tolist() == [-1]
        assert tree_shape(tree).depth == 0 and tree_shape(tree).width == 0


@pytest.mark.parametrize("builder", [build_tree, build_tree_reference, build_tree_heap])
@pytest.mark.parametrize("bad", [0.5, float("nan")])
def test_not_logprobs_is_an_error(builder, bad: float):
    lp = make_logprobs(0, 3, 10, "continuous")
    lp[1, 4] = bad
    with pytest.raises(ValueError, match="log-probabilities"):
        builder(lp, 0, 32, 4)


@pytest.mark.parametrize("builder", [build_tree, build_tree_reference, build_tree_heap])
def test_bad_arguments(builder):
    lp = make_logprobs(0, 3, 10, "continuous")
    with pytest.raises(ValueError, match="topk"):
        builder(lp, 0, 8, 0)
    with pytest.raises(ValueError, match="budget"):
        builder(lp, 0, -1, 4)
    with pytest.raises(ValueError, match=r"\[D, V\]"):
        builder(lp[0], 0, 8, 4)
    with pytest.raises(ValueError, match="depth"):
        spine_tree(lp, 0, 4)


def test_large_vocab_parity_and_half_precision_input():
    lp = make_logprobs(4, 15, 151936, "continuous").to(torch.bfloat16)  # bf16 creates many ties
    for budget, topk in ((16, 8), (64, 8), (256, 16)):
        ref = build_tree_reference(lp, 1, budget, topk)
        assert_same_tree(ref, build_tree(lp, 1, budget, topk))
        assert_same_tree(ref, build_tree_heap(lp, 1, budget, topk))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_build_compile_walk_equal_cpu():
    for seed, kind in enumerate(KINDS):
        lp = make_logprobs(seed, 15, 1000, kind)
        ref = build_tree_reference(lp, 2, 256, 8)
        vec = build_tree(lp.cuda(), 2, 256, 8)
        assert all(getattr(vec, f).device.type == "cuda" for f in FIELDS)
        assert_same_tree(ref, DraftTree(*(getattr(vec, f).cpu() for f in FIELDS)))
        heap = build_tree_heap(lp.cuda(), 2, 256, 8)
        assert_same_tree(ref, DraftTree(*(getattr(heap, f).cpu() for f in FIELDS)))
        on_host = build_tree_heap(lp.cuda(), 2, 256, 8, device=torch.device("cpu"))  # the SGLang worker's call
        assert all(getattr(on_host, f).device.type == "cpu" for f in FIELDS)
        assert_same_tree(ref, on_host)
        cpu_inputs, cuda_inputs = compile_tree(ref, 50), compile_tree(vec, 50)
        assert cuda_inputs.attention_mask.device.type == "cuda"
        assert torch.equal(cpu_inputs.attention_mask, cuda_inputs.attention_mask.cpu())
        assert torch.equal(cpu_inputs.position_ids, cuda_inputs.position_ids.cpu())
        assert [g.tolist() for g in cpu_inputs.depth_groups] == [g.tolist() for g in cuda_inputs.depth_groups]
        logits, _ = following_logits(ref, 1000, levels=4, seed=seed)
        assert walk_tree(ref, logits) == walk_tree(vec, logits.cuda())


# --------------------------------------------------------------------------------------- compile


@st.composite
def random_trees(draw: st.DrawFn) -> DraftTree:
    n = draw(st.integers(1, 60))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    depths = [0]
    for p in parents[1:]:
        depths.append(depths[p] + 1)
    return DraftTree(
        tokens=torch.tensor(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))),
        parents=torch.tensor(parents),
        depths=torch.tensor(depths),
        scores=torch.zeros(n),
    )


@PROPERTY
@given(tree=random_trees(), prefix_len=st.integers(0, 1000))
def test_compile_mask_equals_brute_force_ancestors(tree: DraftTree, prefix_len: int):
    inputs = compile_tree(tree, prefix_len)
    parents = tree.parents.tolist()
    n = tree.num_nodes
    expected = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j != -1:
            expected[i, j] = True
            j = parents[j]
    assert torch.equal(inputs.attention_mask, expected)
    assert torch.equal(inputs.position_ids, tree.depths + prefix_len)
    assert torch.equal(inputs.input_ids, tree.tokens)
    assert torch.equal(inputs.parents, tree.parents)
    groups = [g.tolist() for g in inputs.depth_groups]
    assert groups[0] == [0]
    assert sorted(i for group in groups for i in group) == list(range(n))
    for d, group in enumerate(groups):
        assert group == sorted(group)
        assert all(int(tree.depths[i]) == d for i in group)


def test_ancestor_mask_of_a_built_tree_rows_sum_to_depth_plus_one():
    tree = build_tree(make_logprobs(5, 15, 500, "continuous"), 0, 256, 8)
    mask = ancestor_mask(tree.parents, depth_groups(tree.depths))
    assert torch.equal(mask.sum(-1), tree.depths + 1)
    assert torch.equal(mask, mask.tril())  # parent-before-child: ancestors have smaller ids


# --------------------------------------------------------------------------------------- walk


def hand_tree() -> DraftTree:
    """root(100) -> 1:[tok 1] -> 3:[tok 3] -> 5:[tok 5]      (spine)
    -> 2:[tok 2] -> 4:[tok 4]"""
    return DraftTree(
        tokens=torch.tensor([100, 1, 2, 3, 4, 5]),
        parents=torch.tensor([-1, 0, 0, 1, 2, 3]),
        depths=torch.tensor([0, 1, 1, 2, 2, 3]),
        scores=torch.tensor([0.0, -0.1, -0.2, -0.3, -0.4, -0.5]),
    )


def target_choosing(choices: dict[int, int], n: int = 6, vocab: int = 128) -> torch.Tensor:
    """[n, vocab] logits whose argmax at node i is choices[i]; rows never visited are NaN, so using them
    would show."""
    logits = torch.full((n, vocab), float("nan"))
    for node, token in choices.items():
        logits[node] = 0.0
        logits[node, token] = 5.0
    return logits


def test_walk_accepts_an_off_spine_branch():
    tree = hand_tree()
    result = walk_tree(tree, target_choosing({0: 2, 2: 4, 4: 77}))
    assert result.accepted == (0, 2, 4)
    assert result.bonus_token == 77
    assert is_off_spine(tree, result.accepted)


def test_walk_accepts_the_full_depth():
    tree = hand_tree()
    result = walk_tree(tree, target_choosing({0: 1, 1: 3, 3: 5, 5: 9}))
    assert result.accepted == (0, 1, 3, 5)
    assert result.bonus_token == 9
    assert not is_off_spine(tree, result.accepted)
    committed = [*tree.tokens[list(result.accepted[1:])].tolist(), result.bonus_token]
    assert committed == [1, 3, 5, 9] and len(committed) == len(result.accepted)


def test_walk_immediate_miss_commits_only_the_bonus():
    result = walk_tree(hand_tree(), target_choosing({0: 42}))
    assert result.accepted == (0,)
    assert result.bonus_token == 42
    assert not is_off_spine(hand_tree(), result.accepted)


def test_walk_rejects_mismatched_logits():
    with pytest.raises(ValueError, match="target_logits"):
        walk_tree(hand_tree(), torch.zeros(5, 10))
    with pytest.raises(ValueError, match="temperature"):
        walk_tree(hand_tree(), torch.zeros(6, 10), temperature=-1.0)


def following_logits(tree: DraftTree, vocab: int, levels: int, seed: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """[N, vocab] random logits whose argmax follows the last child of each node for `levels` levels, and
    that path (root first)."""
    logits = torch.randn(tree.num_nodes, vocab, generator=torch.Generator().manual_seed(seed))
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    path = [0]
    for _ in range(levels):
        children = [c for c in range(1, tree.num_nodes) if parents[c] == path[-1]]
        if not children:
            break
        path.append(children[-1])
        logits[path[-2], tokens[path[-1]]] = 100.0
    return logits, tuple(path)


def test_batched_greedy_walk_equals_visited_rows_walk(monkeypatch: pytest.MonkeyPatch):
    tree = build_tree(make_logprobs(8, 10, 300, "continuous"), 0, 64, 4)
    longest = 0
    for levels in range(5):
        logits, path = following_logits(tree, 300, levels=levels, seed=levels)
        lazy = walk_tree(tree, logits)
        assert lazy.accepted[: len(path)] == path
        longest = max(longest, len(lazy.accepted))
        monkeypatch.setattr(ddtree.tree, "_batch_greedy", lambda device: True)
        assert walk_tree(tree, logits) == lazy
        monkeypatch.undo()
    assert longest >= 3


def test_sampling_walk_first_token_follows_the_target_distribution():
    # The root's two children cover tokens 0 and 1; the first committed token is either an accepted child or
    # the bonus token sampled at the root, and must follow the target's distribution at the root exactly.
    probs = torch.tensor([0.35, 0.25, 0.2, 0.12, 0.08])
    temperature = 0.7
    logits = torch.zeros(3, 5)
    logits[0] = probs.log() * temperature  # softmax(logits / T) == probs
    tree = DraftTree(
        tokens=torch.tensor([9, 0, 1]),
        parents=torch.tensor([-1, 0, 0]),
        depths=torch.tensor([0, 1, 1]),
        scores=torch.zeros(3),
    )
    g = torch.Generator().manual_seed(1234)
    trials = 4000
    counts = [0] * 5
    for _ in range(trials):
        r = walk_tree(tree, logits, temperature=temperature, generator=g)
        first = int(tree.tokens[r.accepted[1]]) if len(r.accepted) > 1 else r.bonus_token
        counts[first] += 1
    chi2 = sum((c - trials * p) ** 2 / (trials * p) for c, p in zip(counts, probs.tolist(), strict=True))
    # df = 4; 18.47 is the 0.999 quantile. Fixed seed, so the statistic is deterministic.
    assert chi2 < 18.47, (counts, chi2)
    assert counts[0] > 0 and counts[4] > 0


def test_sampling_walk_draws_exactly_like_sequential_sampling():
    # One draw per visited node, the same primitive as plain decoding: a shared seed gives the same stream.
    lp = make_logprobs(6, 8, 6, "continuous")
    tree = build_tree(lp, 0, budget=40, topk=3)
    logits = make_logprobs(7, tree.num_nodes, 6, "continuous") * 0.5
    for seed in range(20):
        r = walk_tree(tree, logits, temperature=1.0, generator=torch.Generator().manual_seed(seed))
        g = torch.Generator().manual_seed(seed)
        expected = [sample_token(logits[node], 1.0, g) for node in r.accepted]
        assert [*tree.tokens[list(r.accepted[1:])].tolist(), r.bonus_token] == expected
