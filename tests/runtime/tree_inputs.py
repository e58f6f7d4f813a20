"""The drafter log-probs every tree-build parity test feeds its builders (test_tree: reference / vectorised / heap;
test_batch_tree and test_sglang_batch_round: batched vs heap; test_fused_tree: Triton vs torch). One generator, so
the implementations are compared on the same kinds of input, the tie-heavy ones included.

Plain torch and no test framework: test_fused_tree's subprocess imports it too."""

from __future__ import annotations

import math

import torch

# continuous: no ties; quantized: few distinct values, 0.0 included (ties everywhere, zero-cost children);
# uniform: every token of a row ties; neg_inf: most tokens masked, a row may be entirely -inf or hold fewer
# finite tokens than the top-k; peaked_ties: a few winners, then a long run of equal values cut by the top-k;
# bf16: bf16-rounded values, long runs of equal values near the top.
KINDS = ("continuous", "quantized", "uniform", "neg_inf", "peaked_ties", "bf16")


def make_logprobs(seed: int, rows: int, vocab: int, kind: str, masked: float = 0.6) -> torch.Tensor:
    """[rows, vocab] log-prob-like values of `kind`; `masked` is neg_inf's share of -inf tokens."""
    g = torch.Generator().manual_seed(seed)
    if kind == "continuous":
        return (torch.randn(rows, vocab, generator=g) * 3).log_softmax(-1)
    if kind == "quantized":
        return -torch.randint(0, 4, (rows, vocab), generator=g).float() * 0.25
    if kind == "uniform":
        return torch.full((rows, vocab), -math.log(vocab))
    if kind == "neg_inf":
        lp = (torch.randn(rows, vocab, generator=g) * 3).log_softmax(-1)
        return lp.masked_fill(torch.rand(rows, vocab, generator=g) < masked, float("-inf"))
    if kind == "peaked_ties":
        lp = torch.full((rows, vocab), -9.0)
        for r in range(rows):
            lp[r, torch.randint(vocab, (3,), generator=g)] = -torch.rand(3, generator=g)
        return lp
    if kind == "bf16":
        return (torch.randn(rows, vocab, generator=g) * 2).to(torch.bfloat16).float().log_softmax(-1)
    raise AssertionError(kind)


def batch_logprobs(
    seed: int, bs: int, rows: int, vocab: int, kinds: list[str] | tuple[str, ...], masked: float = 0.6
) -> torch.Tensor:
    """[bs, rows, vocab]: request b is `make_logprobs(seed + b, ...)` of kind `kinds[b % len(kinds)]`."""
    return torch.stack([make_logprobs(seed + b, rows, vocab, kinds[b % len(kinds)], masked) for b in range(bs)])


def links(parents: list[int], slots: int) -> tuple[list[int], list[int]]:
    """SGLang's retrieve_next_token / retrieve_next_sibling for a parent array, children in id order."""
    first, sib = [-1] * slots, [-1] * slots
    last: dict[int, int] = {}
    for i in range(1, len(parents)):
        p = parents[i]
        if p in last:
            sib[last[p]] = i
        else:
            first[p] = i
        last[p] = i
    return first, sib
