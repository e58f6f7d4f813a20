"""Sampling (temperature 1): tree-mode tokens follow the target's own distribution.

For a fixed prompt the exact marginal distribution of generated token t (t = 1..3) is computed by
enumerating every earlier continuation (V^(t-1) sequences, V = 16). Tree-mode generations (off-spine and
multi-token acceptances included) are compared with it by a chi-square goodness-of-fit test per position:
fixed seeds, cells with expected count < 5 pooled, and the test fails when p < ALPHA = 1e-3 (documented
threshold; with 3 positions the chance of a false alarm is about 0.3 %, and with fixed seeds the outcome is
deterministic). A negative control must be rejected, which shows the test has power at this sample size:
the same number of draws from the exact marginals of the target at temperature 1.5.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from ddtree.config import DDTreeConfig
from ddtree.engine import Mode, OracleNoiseDrafter, ReferenceEngine
from tiny_targets import hybrid_target, one_thread

pytestmark = [pytest.mark.runtime, pytest.mark.usefixtures("one_thread")]
__all__ = ["one_thread"]  # the fixture, imported for pytest

VOCAB = 16
BLOCK = 4  # drafted depth 3
POSITIONS = 3
RUNS = 300
ALPHA = 1e-3
PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return hybrid_target(VOCAB, seed=3, init=0.5)


@torch.no_grad()
def exact_marginals(
    model: torch.nn.Module, prompt: list[int], positions: int, temperature: float = 1.0
) -> list[torch.Tensor]:
    """P(token at generated position t) for t = 1..positions, by enumeration: [positions] x [V]."""
    out = []
    for t in range(positions):
        prefixes = list(itertools.product(range(VOCAB), repeat=t))  # every continuation of length t
        ids = torch.tensor([[*prompt, *p] for p in prefixes])  # [V^t, P + t]
        probs = torch.softmax(model(input_ids=ids).logits[:, -1].float() / temperature, dim=-1)  # [V^t, V]
        weight = torch.ones(len(prefixes))
        for j in range(t):  # probability of each prefix
            pre_ids = torch.tensor([[*prompt, *p[:j]] for p in prefixes])
            step = torch.softmax(model(input_ids=pre_ids).logits[:, -1].float() / temperature, dim=-1)
            weight = weight * step[torch.arange(len(prefixes)), torch.tensor([p[j] for p in prefixes])]
        out.append((weight[:, None] * probs).sum(0))
    return out


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Goodness of fit; cells with expected < 5 are pooled into one. Returns (statistic, p-value)."""
    n = counts.sum()
    expected = n * probs.double()
    small = expected < 5
    obs = torch.cat([counts[~small].double(), counts[small].double().sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    df = obs.numel() - 1
    p = torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0)
    return float(stat), float(p)


def test_tree_sampling_matches_target_distribution(target: torch.nn.Module) -> None:
    exact = exact_marginals(target, PROMPT, POSITIONS)
    drafter = OracleNoiseDrafter(target, BLOCK, noise=0.5)
    engine = ReferenceEngine(target, Mode.TREE, drafter=drafter, ddtree=DDTreeConfig(budget=10, topk=3))
    counts = torch.zeros(POSITIONS, VOCAB, dtype=torch.long)
    accepted_multi = off_spine = 0
    for seed in range(RUNS):
        tokens = engine.generate(PROMPT, POSITIONS, temperature=1.0, seed=seed).tokens
        accepted_multi += sum(r.accepted_len > 1 for r in engine.last_stats)
        off_spine += sum(r.off_spine for r in engine.last_stats)
        for t, tok in enumerate(tokens):
            counts[t, tok] += 1
    results = [chi_square_p(counts[t], exact[t]) for t in range(POSITIONS)]
    print(f"\ntree: multi-token rounds={accepted_multi} off-spine rounds={off_spine}")
    for t, (stat, p) in enumerate(results):
        print(f"position {t + 1}: chi2={stat:.2f} p={p:.4f}")
    assert accepted_multi >= RUNS // 4 and off_spine >= 10  # the walk really took drafted branches
    assert all(p >= ALPHA for _, p in results)


def test_chi_square_rejects_a_wrong_distribution(target: torch.nn.Module) -> None:
    exact = exact_marginals(target, PROMPT, POSITIONS)
    hot = exact_marginals(target, PROMPT, POSITIONS, temperature=1.5)
    g = torch.Generator().manual_seed(0)
    results = []
    for t in range(POSITIONS):
        draws = torch.multinomial(hot[t], RUNS, replacement=True, generator=g)
        results.append(chi_square_p(torch.bincount(draws, minlength=VOCAB), exact[t]))
    print(
        "\ncontrol (T=1.5 draws vs T=1 marginals): " + " ".join(f"p{t + 1}={p:.2e}" for t, (_, p) in enumerate(results))
    )
    assert all(p < ALPHA for _, p in results[1:])  # positions 2 and 3: the ones the tree walk produces
