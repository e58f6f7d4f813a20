"""ddtree.sglang.selfcheck: what a self-check round commits, and the mismatch it reports, from the tree round's
tokens and a chain verify's argmax (planted agreements and disagreements); `SelfCheck`, the worker's self-check
object, on a stand-in verifier that returns planted chain verdicts."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from ddtree.sglang.batch_round import BatchCommit
from ddtree.sglang.selfcheck import (
    STATE_TOLERANCE,
    TIE_TOLERANCE,
    AcceptedStates,
    SelfCheck,
    accepted_states,
    chain_accept_index,
    chain_check,
    mismatch_gaps,
    state_gaps,
)
from ddtree.sglang.tree_round import KVWindow
from torch import Tensor

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


def test_a_check_is_due_every_nth_tree_round_and_never_at_zero() -> None:
    every3, off = SelfCheck(every=3, rank=0), SelfCheck(every=0, rank=0)
    assert [every3.due() for _ in range(7)] == [False, False, True, False, False, True, False]
    assert not any(off.due() for _ in range(7)) and off.rounds == 7


class ChainStandIn:
    """A ChainVerifier whose chain verify answers `predict` with `logits`, recording what it was asked."""

    block = 4

    def __init__(self, predict: Tensor, logits: Tensor) -> None:
        self.predict, self.logits = predict, logits
        self.asked: list[Tensor] = []

    def chain_verify(
        self, batch: Any, draft_input: Any, tokens: Tensor, window: KVWindow
    ) -> tuple[Any, Tensor, Tensor]:
        self.asked.append(tokens)
        return "chain forward", self.logits, self.predict

    def verify_states(self, steps: Tensor) -> AcceptedStates:
        raise AssertionError("a dense target has no recurrent states")

    def hidden_loc(self, window: KVWindow, width: int) -> Tensor:
        return window.locs[:, :width] + 1000


def _check_round(chain_predict: Tensor, logits: Tensor) -> tuple[SelfCheck, Any, ChainStandIn]:
    """One check round of 2 requests, B = 4, S = 8: request 0 accepted slots 0, 2, 5 (3 tokens), request 1 slot 0."""
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24, 25, 26, 27]])
    perm = torch.tensor([[0, 2, 5, 1, 3, 4, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7]])
    commit = BatchCommit(
        path=torch.tensor([[0, 2, 5], [0, -1, -1]]),
        out_tokens=torch.tensor([[12, 15, 9, 0, 0, 0, 0, 0], [8, 0, 0, 0, 0, 0, 0, 0]]),
        commit_lens=torch.tensor([3, 1], dtype=torch.int32),
        bonus=torch.tensor([9, 8]),
        perm=perm,
        off_spine=torch.tensor([True, False]),
        bad_path=torch.tensor([False, False]),
    )
    locs = torch.arange(16).view(2, 8)
    window = KVWindow(positions=locs, locs=locs, plan=None)
    planned = SimpleNamespace(plan=SimpleNamespace(tokens=tokens))
    verified = SimpleNamespace(conv_snapshot=None)
    batch = SimpleNamespace(sampling_info=None)
    verifier = ChainStandIn(chain_predict, logits)
    check = SelfCheck(every=1, rank=0)
    check.due()
    kept = check.keep_chain(verifier, batch, None, SimpleNamespace(window=window), planned, verified, commit)
    assert verifier.asked[0].tolist() == [[10, 12, 15, 11], [20, 21, 22, 23]]  # each path in order, then filler
    return check, kept, verifier


def test_a_check_round_keeps_the_chain_and_passes_when_it_agrees(caplog: pytest.LogCaptureFixture) -> None:
    logits = torch.zeros(2, 4, 30)
    with caplog.at_level(logging.INFO, logger="ddtree"):
        check, kept, _ = _check_round(torch.tensor([[12, 15, 9, 1], [8, 3, 3, 3]]), logits)
    assert check.fallback == ""
    assert kept.commit_lens.tolist() == [3, 1] and kept.out_tokens.tolist() == [[12, 15, 9, 0], [8, 0, 0, 0]]
    assert kept.state_width == 4 and kept.hidden_rows is None and kept.logits_output == "chain forward"
    assert kept.hidden_loc.tolist() == [[1000, 1001, 1002, 1003], [1008, 1009, 1010, 1011]]
    assert "self-check round 1: the tree verify equals the chain verify" in caplog.text


def test_a_check_that_finds_a_real_difference_sets_the_fallback(caplog: pytest.LogCaptureFixture) -> None:
    logits = torch.zeros(2, 4, 30)
    logits[0, 1, 7] = 20.0  # the chain's 7 beats the tree's 15 at path position 1 by 20: no tie
    with caplog.at_level(logging.INFO, logger="ddtree"):
        check, kept, _ = _check_round(torch.tensor([[12, 7, 9, 1], [8, 3, 3, 3]]), logits)
    assert kept.commit_lens.tolist() == [2, 1] and kept.out_tokens[0].tolist() == [12, 7, 0, 0]  # exact anyway
    assert check.fallback.startswith("self-check round 1: request 0 path position 1: tree verify 15, chain verify 7")
    assert "DDTREE self-check FAILED" in caplog.text


def test_a_near_tie_is_rounding_not_a_failure() -> None:
    logits = torch.zeros(2, 4, 30)
    logits[0, 1, 7], logits[0, 1, 15] = 1.0, 0.99  # float32: within TIE_TOLERANCE
    check, kept, _ = _check_round(torch.tensor([[12, 7, 9, 1], [8, 3, 3, 3]]), logits)
    assert check.fallback == "" and kept.commit_lens.tolist() == [2, 1]
