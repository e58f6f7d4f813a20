"""ddtree.acceptance: the per-node logit rules against a row-by-row reference of SGLang's baseline rules, the
batched walk against the sequential one, and the tree round's sampling against a distribution oracle.

The oracle: a fixed Markov law T over a 4-token vocabulary is the target; the drafter proposes per-depth rows Q
that differ from it (as a DFlash drafter's do). Every round builds a DDTree tree per sample with the production
planner (`plan_batch`: best-first, top-k 3, budget 6, one padding slot), draws one choice per node from the
target, walks, and rounds repeat until three tokens are committed. The joint law of those three tokens must be
T's (chi-square over the 64 cells, alpha 1e-3, 120 000 samples: a total-variation error of 0.02 is caught with
power > 0.9, docs in ../shared notes). Two wrong acceptance rules must be rejected by the same test: min(1, p/q)
acceptance of drafted children, and one uniform shared by every node of a round.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from ddtree.acceptance import (
    PENALTIES,
    RequestRules,
    apply_node_rules,
    batch_rules,
    chain_layout,
    walk_batch,
)
from ddtree.sglang.batch_round import plan_batch
from ddtree.tree import walk_visiting
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.runtime

VOCAB = 12


def random_tree(draw: st.DrawFn, slots: int) -> tuple[list[int], list[int]]:
    """parents (parents[0] = -1, parents[i] < i) and depths of a random tree of `slots` nodes."""
    parents, depths = [-1], [0]
    for i in range(1, slots):
        parent = draw(st.integers(0, i - 1))
        parents.append(parent)
        depths.append(depths[parent] + 1)
    return parents, depths


def ancestors_mask(parents: list[int]) -> torch.Tensor:
    slots = len(parents)
    mask = torch.zeros((slots, slots), dtype=torch.bool)
    for i in range(slots):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def baseline_row(
    logits: torch.Tensor, rule: RequestRules, history: list[int], order: tuple[str, ...] = PENALTIES
) -> torch.Tensor:
    """SGLang's non-speculative rules on one row, written from its penalizers one token at a time, in `order`:
    frequency per occurrence, presence once, min_new_tokens' -inf on stop tokens, repetition by the sign of the
    logit it meets; then logit_bias."""
    row = logits.clone()
    for penalty in order:
        if penalty == "frequency":
            for token in history:
                row[token] -= rule.frequency_penalty
        elif penalty == "presence":
            for token in set(history):
                row[token] -= rule.presence_penalty
        elif penalty == "min_new_tokens":
            if len(history) < rule.min_new_tokens:
                for token in rule.stop_token_ids:
                    row[token] = float("-inf")
        else:
            for token in set(history):
                value = row[token]
                row[token] = value * rule.repetition_penalty if value < 0 else value / rule.repetition_penalty
    for token, value in rule.logit_bias.items():
        row[token] += value
    return row


rules_strategy = st.builds(
    RequestRules,
    frequency_penalty=st.sampled_from([0.0, 0.5, 1.5, -0.3]),
    presence_penalty=st.sampled_from([0.0, 0.8]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.7]),
    min_new_tokens=st.integers(0, 8),
    stop_token_ids=st.frozensets(st.integers(0, VOCAB - 1), max_size=2),
    logit_bias=st.dictionaries(st.integers(0, VOCAB - 1), st.sampled_from([-100.0, 2.5]), max_size=2),
)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), bs=st.integers(1, 3), slots=st.integers(1, 7), order=st.permutations(PENALTIES).map(tuple))
def test_node_rules_equal_the_baseline_rules_at_each_nodes_position(
    data: st.DataObject, bs: int, slots: int, order: tuple[str, ...]
) -> None:
    """Every node's adjusted row equals the baseline's row for the output 'committed + the node's path', in any
    order of the penalties (SGLang's non-speculative decode applies them in its orchestrator's order)."""
    trees = [random_tree(data.draw, slots) for _ in range(bs)]
    rules = [data.draw(rules_strategy) for _ in range(bs)]
    outputs = [data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)) for _ in range(bs)]
    tokens = torch.tensor([data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=slots, max_size=slots))
                           for _ in range(bs)])  # fmt: skip
    tokens[:, 0] = torch.tensor([out[-1] for out in outputs])  # the root is the last committed token
    mask = torch.stack([ancestors_mask(parents) for parents, _ in trees])
    depths = torch.tensor([d for _, d in trees])
    logits = torch.randn(bs, slots, VOCAB, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    batch = batch_rules(rules, outputs, VOCAB, torch.device("cpu"))
    if batch is None:
        assert not any(rule.active for rule in rules)
        return
    got = apply_node_rules(logits, tokens, mask, depths, batch, order)
    for b, (_, node_depths) in enumerate(trees):
        for i in range(slots):
            path = [j for j in range(slots) if mask[b, i, j] and node_depths[j] >= 1]
            history = outputs[b] + [int(tokens[b, j]) for j in sorted(path, key=lambda j: node_depths[j])]
            want = baseline_row(logits[b, i], rules[b], history, order)
            torch.testing.assert_close(got[b, i], want, msg=f"request {b} node {i} history {history}")


def test_node_rules_leave_the_verify_logits_untouched() -> None:
    logits = torch.randn(1, 3, VOCAB)
    before = logits.clone()
    batch = batch_rules([RequestRules(frequency_penalty=1.0)], [[1, 2]], VOCAB, torch.device("cpu"))
    assert batch is not None
    mask, depths = chain_layout(3, 1, torch.device("cpu"))
    adjusted = apply_node_rules(logits, torch.tensor([[2, 5, 5]]), mask, depths, batch)
    assert torch.equal(logits, before)
    # node 2's path holds 5 twice (depths 1 and 2) and the committed output 2 once: token 5 pays twice
    assert float(before[0, 2, 5] - adjusted[0, 2, 5]) == pytest.approx(2.0)
    assert float(before[0, 2, 2] - adjusted[0, 2, 2]) == pytest.approx(1.0)


def test_the_repetition_penalty_s_place_changes_the_row_and_a_bad_order_is_refused() -> None:
    cpu = torch.device("cpu")
    batch = batch_rules([RequestRules(presence_penalty=0.8, repetition_penalty=1.3)], [[4]], VOCAB, cpu)
    assert batch is not None
    mask, depths = chain_layout(1, 1, cpu)
    logits = torch.full((1, 1, VOCAB), 2.0)
    first = apply_node_rules(logits, torch.tensor([[4]]), mask, depths, batch, ("repetition", "frequency",
                             "presence", "min_new_tokens"))  # fmt: skip
    last = apply_node_rules(logits, torch.tensor([[4]]), mask, depths, batch)
    assert float(first[0, 0, 4]) == pytest.approx(2.0 / 1.3 - 0.8) and float(last[0, 0, 4]) == pytest.approx(1.2 / 1.3)
    with pytest.raises(ValueError, match="permutation"):
        apply_node_rules(logits, torch.tensor([[4]]), mask, depths, batch, ("frequency",))


def test_no_rules_is_none_and_a_logit_bias_alone_is_kept() -> None:
    cpu = torch.device("cpu")
    assert batch_rules([RequestRules(), RequestRules()], [[1], [2]], VOCAB, cpu) is None
    batch = batch_rules([RequestRules(logit_bias={3: -100.0}), RequestRules()], [[1], [2]], VOCAB, cpu)
    assert batch is not None and batch.logit_bias is not None
    assert batch.logit_bias[0, 3] == -100.0 and batch.logit_bias[1].abs().sum() == 0


@settings(max_examples=80, deadline=None)
@given(data=st.data(), slots=st.integers(1, 9), padding=st.integers(0, 2))
def test_the_batched_walk_equals_the_sequential_walk(data: st.DataObject, slots: int, padding: int) -> None:
    parents, _ = random_tree(data.draw, slots)
    tokens = data.draw(st.lists(st.integers(0, 3), min_size=slots, max_size=slots))
    choices = data.draw(st.lists(st.integers(0, 3), min_size=slots + padding, max_size=slots + padding))
    want = walk_visiting(parents, tokens, lambda path: choices[path[-1]])
    # padding slots hang off the root and carry the root's token: never accepted
    padded_parents = parents + [0] * padding
    padded_tokens = tokens + [tokens[0]] * padding
    real = torch.tensor([[True] * slots + [False] * padding])
    got = walk_batch(torch.tensor([padded_tokens]), torch.tensor([padded_parents]), real, torch.tensor([choices]))
    tau = int(got.commit_lens[0])
    assert tuple(got.path[0, :tau].tolist()) == want.accepted
    committed = [tokens[node] for node in want.accepted[1:]] + [want.bonus_token]
    assert got.out_tokens[0, :tau].tolist() == committed


# --- the distribution oracle ---------------------------------------------------------------------------------

ORACLE_VOCAB, DEPTH, BUDGET, TOPK, SLOTS, SAMPLES, ALPHA = 4, 3, 6, 3, 8, 120_000, 1e-3
# the target: a Markov law T[previous token, next token]
TARGET = torch.tensor(
    [[0.50, 0.25, 0.15, 0.10], [0.10, 0.60, 0.20, 0.10], [0.30, 0.30, 0.30, 0.10], [0.05, 0.15, 0.30, 0.50]]
)
ROOT = 2


def draft_rows(roots: torch.Tensor) -> torch.Tensor:
    """[n, DEPTH, V] the drafter's log-probs per depth, from the root token: T's chain marginals, flattened
    towards uniform and shifted by one token (a drafter that is often wrong, so off-spine paths win)."""
    rows, law = [], torch.eye(ORACLE_VOCAB)[roots]
    for _ in range(DEPTH):
        law = law @ TARGET
        rows.append(0.6 * law.roll(1, dims=-1) + 0.4 / ORACLE_VOCAB)
    return torch.stack(rows, dim=1).log()


@dataclass(frozen=True)
class Trees:
    """Each sample's tree this round (the production plan of its root token)."""

    tokens: torch.Tensor  # [n, S]
    parents: torch.Tensor  # [n, S]
    depths: torch.Tensor  # [n, S]
    num_nodes: int


def trees_for(roots: torch.Tensor) -> Trees:
    """The drafter's rows depend on the root token only: one production plan per vocabulary token, indexed."""
    every = torch.arange(ORACLE_VOCAB)
    plan = plan_batch(draft_rows(every), every, torch.zeros(ORACLE_VOCAB, dtype=torch.int64), SLOTS, BUDGET, TOPK)
    return Trees(plan.tokens[roots], plan.parents[roots], plan.depths[roots], plan.num_nodes)


def sample_and_walk(tokens: torch.Tensor, plan: Trees, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The production rule: one independent draw per node from the target, then the walk."""
    n, slots = tokens.shape
    probs = TARGET[tokens].reshape(n * slots, ORACLE_VOCAB)
    choices = torch.multinomial(probs, 1, generator=gen).view(n, slots)
    real = torch.arange(slots).unsqueeze(0) < plan.num_nodes
    result = walk_batch(tokens, plan.parents, real.expand(n, slots), choices)
    return result.out_tokens, result.commit_lens


def shared_uniform(tokens: torch.Tensor, plan: Trees, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Wrong: one uniform per round, shared by every node (inverse-CDF draws correlated across depths)."""
    n, slots = tokens.shape
    u = torch.rand((n, 1), generator=gen).expand(n, slots)
    cdf = TARGET[tokens].cumsum(dim=-1)  # [n, S, V]
    choices = (u.unsqueeze(-1) >= cdf).sum(dim=-1).clamp(max=ORACLE_VOCAB - 1)
    real = torch.arange(slots).unsqueeze(0) < plan.num_nodes
    result = walk_batch(tokens, plan.parents, real.expand(n, slots), choices)
    return result.out_tokens, result.commit_lens


def ratio_acceptance(tokens: torch.Tensor, plan: Trees, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Wrong: each visited node tries its children in order, accepting child x with probability
    min(1, p(x) / q(x)) (q: the drafter's row at the child's depth); with none accepted, the bonus is a draw
    from p. Lossless only for a single chain with residual sampling; on a top-k tree it is biased."""
    n, slots = tokens.shape
    parents, depths = plan.parents, plan.depths
    q = draft_rows(tokens[:, 0]).exp()  # [n, DEPTH, V]
    out = torch.zeros((n, slots), dtype=torch.int64)
    lens = torch.ones(n, dtype=torch.int64)
    current = torch.zeros(n, dtype=torch.int64)
    alive = torch.ones(n, dtype=torch.bool)
    rows = torch.arange(n)
    real = torch.arange(slots).unsqueeze(0) < plan.num_nodes
    for step in range(DEPTH + 1):
        p = TARGET[tokens[rows, current]]  # [n, V]
        accepted = torch.full((n,), -1, dtype=torch.int64)
        for child in range(1, slots):  # children in slot order (the planner's best-first order)
            is_child = (parents[:, child] == current) & real[0, child] & alive & (accepted < 0)
            token = tokens[:, child]
            depth = depths[:, child].clamp(min=1, max=DEPTH) - 1
            ratio = (p[rows, token] / q[rows, depth, token]).clamp(max=1.0)
            take = is_child & (torch.rand(n, generator=gen) < ratio)
            accepted = torch.where(take, torch.full_like(accepted, child), accepted)
        bonus = torch.multinomial(p, 1, generator=gen).squeeze(1)
        moved = accepted >= 0
        out[:, step] = torch.where(alive, torch.where(moved, tokens[rows, accepted.clamp(min=0)], bonus), out[:, step])
        lens += (moved & alive).to(torch.int64)
        current = torch.where(moved & alive, accepted, current)
        alive = alive & moved
    return out, lens


def three_tokens(rule: object, seed: int) -> torch.Tensor:
    """[SAMPLES, 3] the first three committed tokens of SAMPLES requests from ROOT, by rounds of `rule`."""
    gen = torch.Generator().manual_seed(seed)
    committed = torch.full((SAMPLES, 3), -1, dtype=torch.int64)
    have = torch.zeros(SAMPLES, dtype=torch.int64)
    roots = torch.full((SAMPLES,), ROOT, dtype=torch.int64)
    rows = torch.arange(SAMPLES)
    while bool((have < 3).any()):
        plan = trees_for(roots)
        out, lens = rule(plan.tokens, plan, gen)  # type: ignore[operator]
        for k in range(SLOTS):
            write = (k < lens) & (have < 3)
            committed[rows[write], have[write]] = out[write, k]
            have += write.to(torch.int64)
        roots = torch.where(have > 0, committed.gather(1, (have - 1).clamp(min=0).unsqueeze(1)).squeeze(1), roots)
    return committed


def chi_square_p(samples: torch.Tensor) -> float:
    """The p-value of samples [n, 3] against T's joint law from ROOT (64 cells, none below 5 expected)."""
    joint = TARGET[ROOT][:, None, None] * TARGET[:, :, None] * TARGET[None, :, :]  # [a, b, c]
    index = samples[:, 0] * 16 + samples[:, 1] * 4 + samples[:, 2]
    observed = torch.bincount(index, minlength=64).double()
    expected = joint.reshape(-1).double() * samples.shape[0]
    assert float(expected.min()) >= 5
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(torch.special.gammaincc(torch.tensor((64 - 1) / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))  # fmt: skip


def test_tree_sampling_commits_the_targets_joint_law() -> None:
    samples = three_tokens(sample_and_walk, seed=0)
    p = chi_square_p(samples)
    assert p > ALPHA, f"p = {p:.3g}: the tree round's sampled tokens do not follow the target"


def test_tree_sampling_oracle_runs_real_trees() -> None:
    """The oracle's trees branch and its rounds accept off the spine and more than one token (else it tests a
    chain, or nothing)."""
    roots = torch.full((4096,), ROOT, dtype=torch.int64)
    plan = plan_batch(draft_rows(roots), roots, torch.zeros(4096, dtype=torch.int64), SLOTS, BUDGET, TOPK)
    assert int(plan.width.max()) >= 2 and plan.num_nodes == BUDGET + 1 < SLOTS
    _, lens = sample_and_walk(plan.tokens, plan, torch.Generator().manual_seed(1))
    assert float(lens.float().mean()) > 1.5
    spine = plan.parents.eq(torch.arange(SLOTS) - 1)  # slot i's parent is slot i - 1: the first chain
    assert not bool(spine[:, 1 : BUDGET + 1].all())


@pytest.mark.parametrize("rule", [ratio_acceptance, shared_uniform], ids=["min(1,p/q)", "shared-uniform"])
def test_the_oracle_rejects_a_wrong_acceptance_rule(rule: object) -> None:
    p = chi_square_p(three_tokens(rule, seed=0))
    assert p < ALPHA, f"p = {p:.3g}: the oracle cannot tell this wrong rule from the target"
