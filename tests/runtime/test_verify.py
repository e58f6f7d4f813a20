"""Dense tree verify (Qwen3): logits at every node == the node's own root-to-node path; KV commit."""

from __future__ import annotations

import pytest
import torch
from ddtree.tree import compile_tree
from ddtree.verify import TargetRunner, tree_mask_4d
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_targets import dense_target, one_thread, random_tree, reference_logits, rel_err, root_paths

pytestmark = [pytest.mark.runtime, pytest.mark.usefixtures("one_thread")]
__all__ = ["one_thread"]  # the fixture, imported for pytest

VOCAB = 64
TOL = 1e-5  # relative: max |tree - path| / max |path| per node


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return dense_target(VOCAB, seed=0)


def _random_tree(seed: int, depth: int, budget: int, topk: int):
    return random_tree(VOCAB, seed, depth, budget, topk)


def test_tree_mask_4d_is_prefix_visible_and_ancestor_only() -> None:
    tree_mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    m = tree_mask_4d(tree_mask, prefix_len=2, dtype=torch.float32)
    assert m.shape == (1, 1, 3, 5)
    visible = m[0, 0] == 0
    assert visible[:, :2].all()
    assert torch.equal(visible[:, 2:], tree_mask)
    assert (m[0, 0][~visible] == torch.finfo(torch.float32).min).all()


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    depth=st.integers(1, 7),
    budget=st.integers(1, 40),
    topk=st.integers(1, 8),
)
def test_dense_tree_verify_matches_each_path(model, seed: int, depth: int, budget: int, topk: int) -> None:
    prompt, tree = _random_tree(seed, depth, budget, topk)
    runner = TargetRunner(model)
    runner.prefill(prompt)
    got = runner.verify(compile_tree(tree, len(prompt))).logits  # [N, V]
    want = reference_logits(model, prompt, tree)
    err = rel_err(got, want)
    assert err.max().item() < TOL, f"max rel err {err.max().item():.2e} at node {int(err.argmax())}"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_commit_keeps_accepted_kv_in_path_order(model, seed: int) -> None:
    prompt, tree = _random_tree(seed, depth=5, budget=24, topk=4)
    runner = TargetRunner(model)
    runner.prefill(prompt)
    runner.verify(compile_tree(tree, len(prompt)))
    deepest = int(tree.depths.argmax())
    path = root_paths(tree.parents.tolist())[deepest]
    runner.commit(path)
    assert runner.prefix_len == len(prompt) + len(path)
    for layer in runner.cache.layers:
        assert layer.keys.shape[-2] == runner.prefix_len
    # the next decode after the commit equals running prompt + path + next token from scratch
    nxt = 7
    got = runner.decode(nxt).logits[-1]
    seq = [*prompt, *tree.tokens[path].tolist(), nxt]
    with torch.no_grad():
        want = model(input_ids=torch.tensor([seq])).logits[0, -1]
    assert rel_err(got[None], want[None]).item() < TOL


def test_commit_requires_a_pending_verify_and_a_rooted_path(model) -> None:
    prompt, tree = _random_tree(4, depth=3, budget=6, topk=2)
    runner = TargetRunner(model)
    runner.prefill(prompt)
    with pytest.raises(RuntimeError, match="without a pending verify"):
        runner.commit([0])
    runner.verify(compile_tree(tree, len(prompt)))
    with pytest.raises(ValueError, match="start at the root"):
        runner.commit([1])
    with pytest.raises(RuntimeError, match="pending"):
        runner.decode(1)
