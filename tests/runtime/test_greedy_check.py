"""The margin-aware greedy comparison (ddtree.greedy_check): a planted near-tie passes, a planted real divergence
fails with its position, both tokens and the gap."""

from __future__ import annotations

import pytest
import torch
from ddtree.greedy_check import (
    FP32_TIE_TOLERANCE,
    Divergence,
    GreedyMismatch,
    compared_length,
    first_divergence,
    top2_gaps,
)

pytestmark = pytest.mark.runtime

WANT = [5, 6, 7, 8, 9, 10]
GAPS = [2.0, 1.5, 0.01, 3.0, 2.5, 1.0]  # position 2 is a near-tie of the reference


def test_top2_gaps_are_largest_minus_second() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 2.0, -1.0], [-5.0, -4.5, -9.0]])
    assert top2_gaps(logits) == pytest.approx([2.0, 0.0, 0.5])


def test_identical_outputs_compare_in_full() -> None:
    assert compared_length(WANT, WANT, GAPS, FP32_TIE_TOLERANCE) == 6
    assert first_divergence(WANT, WANT, GAPS) is None


def test_shorter_output_compares_its_own_length() -> None:
    assert compared_length(WANT[:4], WANT, GAPS, FP32_TIE_TOLERANCE) == 4


def test_divergence_at_a_near_tie_stops_the_comparison_there() -> None:
    got = [5, 6, 99, 1, 2, 3]  # a different token at the near-tie, then anything
    assert first_divergence(got, WANT, GAPS) == Divergence(position=2, got=99, want=7, gap=0.01)
    assert compared_length(got, WANT, GAPS, FP32_TIE_TOLERANCE) == 2


def test_divergence_where_the_reference_is_confident_fails_with_details() -> None:
    got = [5, 6, 7, 42, 9, 10]
    with pytest.raises(GreedyMismatch, match=r"position 3: got 42, reference 8 \(reference top-2 gap 3\)"):
        compared_length(got, WANT, GAPS, FP32_TIE_TOLERANCE)


def test_the_tolerance_is_a_strict_bound() -> None:
    got = [5, 6, 99, 8, 9, 10]
    assert compared_length(got, WANT, GAPS, tolerance=0.011) == 2
    with pytest.raises(GreedyMismatch):
        compared_length(got, WANT, GAPS, tolerance=0.01)


def test_missing_gaps_are_refused() -> None:
    with pytest.raises(ValueError, match="3 gaps for 6 compared positions"):
        compared_length(WANT, WANT, GAPS[:3], FP32_TIE_TOLERANCE)
