"""ddtree.sglang.selfcheck: what a self-check round commits, and the mismatch it reports, from the tree round's
tokens and a chain verify's argmax (planted agreements and disagreements)."""

from __future__ import annotations

import pytest
import torch
from ddtree.sglang.selfcheck import (
    STATE_TOLERANCE,
    TIE_TOLERANCE,
    accepted_states,
    chain_accept_index,
    chain_check,
    mismatch_gaps,
    state_gaps,
)

pytestmark = pytest.mark.runtime


def test_agreement_commits_the_tree_tokens_and_reports_nothing() -> None:
    tree = torch.tensor([[7, 8, 9, 0], [5, 0, 0, 0]])
    lens = torch.tensor([3, 1], dtype=torch.int32)
    chain = torch.tensor([[7, 8, 9, 4], [5, 6, 6, 6]])  # beyond each tree's length the chain may say anything
    check = chain_check(tree, lens, chain)
    assert check.mismatch.tolist() == [-1, -1]
    assert check.commit_lens.tolist() == [3, 1] and check.commit_lens.dtype == torch.int32
    assert check.out_tokens.tolist() == [[7, 8, 9, 0], [5, 0, 0, 0]]
    assert check.bonus.tolist() == [9, 5]


def test_a_disagreement_commits_the_chain_up_to_it_and_reports_the_first() -> None:
    tree = torch.tensor([[7, 8, 9, 3], [5, 6, 0, 0], [1, 2, 3, 0]])
    lens = torch.tensor([4, 2, 3], dtype=torch.int32)
    chain = torch.tensor([[7, 1, 9, 2], [4, 6, 0, 0], [1, 2, 3, 9]])  # request 0 differs at 1 (and 3), 1 at 0
    check = chain_check(tree, lens, chain)
    assert check.mismatch.tolist() == [1, 0, -1]
    assert check.commit_lens.tolist() == [2, 1, 3]
    assert check.out_tokens.tolist() == [[7, 1, 0, 0], [4, 0, 0, 0], [1, 2, 3, 0]]
    assert check.bonus.tolist() == [1, 4, 3]


def test_wide_tree_tokens_are_compared_over_the_chain_width() -> None:
    tree = torch.tensor([[7, 8, 0, 0, 0, 0, 0, 0]])  # a wide tree's [bs, 2B] tokens, B = 4
    check = chain_check(tree, torch.tensor([2], dtype=torch.int32), torch.tensor([[7, 8, 5, 5]]))
    assert check.mismatch.tolist() == [-1] and check.out_tokens.tolist() == [[7, 8, 0, 0]]


def test_chain_accept_index_is_every_position_in_order() -> None:
    index = chain_accept_index(2, 3, torch.device("cpu"))
    assert index.tolist() == [[0, 1, 2], [3, 4, 5]] and index.dtype == torch.int32


def test_mismatch_gaps_measure_the_chain_logits_at_the_first_mismatch() -> None:
    tree = torch.tensor([[7, 8, 9], [5, 6, 0]])
    lens = torch.tensor([3, 2], dtype=torch.int32)
    chain = torch.tensor([[7, 2, 9], [5, 6, 1]])  # request 0 differs at 1; request 1 agrees
    check = chain_check(tree, lens, chain)
    logits = torch.zeros(2, 3, 10)
    logits[0, 1, 2], logits[0, 1, 8] = 3.0, 2.96  # the chain's 2 beats the tree's 8 by 0.04: a near-tie
    gaps = mismatch_gaps(logits, check, tree)
    assert gaps.tolist() == pytest.approx([0.04, 0.0], abs=1e-6)
    assert gaps[0] < TIE_TOLERANCE[torch.float32]
    logits[0, 1, 8] = -9.0  # now a real divergence
    assert mismatch_gaps(logits, check, tree)[0] == pytest.approx(12.0)


def test_accepted_states_read_each_requests_step_and_state_gaps_compare_them() -> None:
    g = torch.Generator().manual_seed(0)
    windows = torch.randn(2, 3, 8, 5, 3, generator=g)  # [L, rows, steps, dim, K - 1]
    states = torch.randn(2, 3, 8, 4, 4, generator=g)  # [L, rows, steps, ...]
    tree = accepted_states([windows], states, torch.tensor([2, 5, 0]))
    assert torch.equal(tree.windows[0][:, 1], windows[:, 1, 5])
    assert tree.state_norms.shape == (2, 3)
    assert tree.state_norms[1, 2] == pytest.approx(float(states[1, 2, 0].norm()))
    windows[:, 1, 5] = 99.0  # the buffer is overwritten by the next verify: the copy is not
    assert not torch.equal(tree.windows[0][:, 1], windows[:, 1, 5])

    same = accepted_states([tree.windows[0].unsqueeze(2).clone()], None, torch.zeros(3, dtype=torch.int64))
    chain = accepted_states([tree.windows[0].unsqueeze(2).clone()], None, torch.zeros(3, dtype=torch.int64))
    chain.windows[0][:, 1] += 0.001  # rounding between two forwards: within the tolerance
    chain.windows[0][0, 2, 0, 0] = 50.0  # another node's inputs: far outside it
    gaps = state_gaps(same, chain, torch.tensor([True, True, True]))
    assert gaps[0] == 0 and 0 < gaps[1] < STATE_TOLERANCE and gaps[2] >= STATE_TOLERANCE
    assert state_gaps(same, chain, torch.tensor([True, True, False]))[2] == 0  # unconfirmed paths are skipped
