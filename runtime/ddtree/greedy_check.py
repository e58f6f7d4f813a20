"""Greedy outputs of two different implementations, compared with the reference's logit margins.

Two float implementations of the same model (SGLang's Triton kernels and transformers' torch ops, a GPU and a
CPU, bf16 and fp32, or one library on two CPUs) round differently. Where the reference's top-2 logits are almost
tied, either token is a correct greedy answer, and everything after it legitimately differs. So a
cross-implementation comparison is exact up to the first difference, accepts that difference only at a genuine
near-tie of the reference (top-2 gap below a stated tolerance), and stops there. Anything else is a real
divergence. Comparisons within one implementation (tree vs baseline on the same engine) stay exact: use `==`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# fp32 vs fp32 across implementations (SGLang's Triton GDN kernels vs transformers' torch ones, AMD EPYC vs Intel
# Xeon): the flip seen on the tiny hybrid target was at a gap of 0.012 logits; 0.1 leaves room for the drift that
# accumulates over 32 tokens and stays far below a confident answer's margin on these models (> 1).
FP32_TIE_TOLERANCE = 0.1


@dataclass(frozen=True)
class Divergence:
    """The first position where two greedy decodes differ, with the reference's top-2 logit gap there."""

    position: int
    got: int
    want: int
    gap: float

    def describe(self) -> str:
        return f"position {self.position}: got {self.got}, reference {self.want} (reference top-2 gap {self.gap:.4g})"


class GreedyMismatch(AssertionError):
    """Two implementations disagree where the reference is not near a tie."""


def top2_gaps(logits: Tensor) -> list[float]:
    """Per row of `logits` [N, V]: the largest logit minus the second largest (>= 0)."""
    top = torch.topk(logits.float(), 2, dim=-1).values  # [N, 2]
    return (top[:, 0] - top[:, 1]).tolist()


def first_divergence(got: Sequence[int], want: Sequence[int], gaps: Sequence[float]) -> Divergence | None:
    """The first position (within the shorter of the two) where the tokens differ, or None."""
    for position, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return Divergence(position, int(a), int(b), float(gaps[position]))
    return None


def compared_length(got: Sequence[int], want: Sequence[int], gaps: Sequence[float], tolerance: float) -> int:
    """How many leading tokens of `got` were checked against the reference `want` (whose top-2 logit gaps at each
    generated position are `gaps`): all of the shorter one when they agree, else the prefix before a near-tie.
    Raises GreedyMismatch when they differ where the reference's gap is >= `tolerance`."""
    if len(gaps) < min(len(got), len(want)):
        raise ValueError(f"{len(gaps)} gaps for {min(len(got), len(want))} compared positions")
    divergence = first_divergence(got, want, gaps)
    if divergence is None:
        return min(len(got), len(want))
    if divergence.gap >= tolerance:
        raise GreedyMismatch(f"real divergence at {divergence.describe()}; tolerance {tolerance}")
    return divergence.position
