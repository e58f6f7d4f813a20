"""The GPU stand-in's torch version of SGLang's `tree_speculative_sampling_target_only`
(dev/sglang_gpu/standin/spec_sampling.py, DFLASH's sampling verify on the stand-in): equal to a plain per-row
reference on fixed coins (trees, chains, the depth cap, zero mass, one-hot rows), and the tokens it commits follow
the target distribution (chi-square; the same test rejects two planted bugs: one coin shared across depths, and
siblings tested against their own probability instead of the running sum)."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from dev_modules import load
from torch import Tensor
from tree_inputs import links

pytestmark = pytest.mark.runtime

PATH = Path(__file__).resolve().parents[2] / "dev" / "sglang_gpu" / "standin" / "spec_sampling.py"


ss = load("ddtree_gpu_standin_spec_sampling", PATH)


def reference(
    cand: list[int], index: list[int], first: list[int], sib: list[int], coins: list[float], final: float,
    probs: list[list[float]], spec: int,
) -> tuple[dict[int, int], list[int], int]:  # fmt: skip
    """One request, read off the kernel's definition: -> ({retrive index: predicted token}, accept_index[:k + 1], k)."""
    draft = [[0.0] * len(probs[0]) for _ in probs]
    predicts: dict[int, int] = {}
    path = [index[0]]
    cur, coin = 0, coins[0]
    for _ in range(1, spec):
        child, running, moved = first[cur], 0.0, False
        while child >= 0:
            p = probs[cur][cand[child]]
            running += p
            if p > 0 and coin < running:
                predicts[index[cur]] = cand[child]
                path.append(index[child])
                cur, coin, moved = child, coins[child], True
                break
            draft[cur][cand[child]] = p
            child = sib[child]
        if not moved:
            break
    k = len(path) - 1
    residual = [max(q - (d if k != spec - 1 else 0.0), 0.0) for q, d in zip(probs[cur], draft[cur], strict=True)]
    u, acc, token = final * sum(residual), 0.0, -1
    for t, r in enumerate(residual):
        acc += r
        if r > 0 and acc > u:
            token = t
            break
    if token < 0:
        positive = [t for t, r in enumerate(residual) if r > 0]
        token = positive[-1] if positive else len(residual) - 1
    predicts[index[cur]] = token
    return predicts, path, k


Batch = dict[str, Tensor]


def make_batch(trees: list[tuple[list[int], list[int]]], slots: int, vocab: int, spec: int, gen: torch.Generator,
               probs: Tensor | None = None) -> Batch:  # fmt: skip
    """SGLang's verify inputs for the given (parents, tokens) trees; random target rows (some zero mass) unless
    given; random coins."""
    bs = len(trees)
    cand = torch.zeros(bs, slots, dtype=torch.int64)
    first = torch.full((bs, slots), -1, dtype=torch.int64)
    sib = torch.full_like(first, -1)
    for b, (parents, toks) in enumerate(trees):
        cand[b, : len(toks)] = torch.tensor(toks)
        f, s = links(parents, slots)
        first[b], sib[b] = torch.tensor(f), torch.tensor(s)
    if probs is None:
        raw = torch.rand(bs, slots, vocab, generator=gen) ** 3
        raw[torch.rand(bs, slots, vocab, generator=gen) < 0.3] = 0  # zero-mass tokens, some of them drafted
        probs = raw / raw.sum(-1, keepdim=True).clamp(min=1e-9)
    return {
        "predicts": torch.full((bs * slots,), -7, dtype=torch.int32),
        "accept_index": torch.full((bs, spec), -7, dtype=torch.int32),
        "accept_token_num": torch.full((bs,), -7, dtype=torch.int32),
        "candidates": cand,
        "retrive_index": torch.arange(bs * slots, dtype=torch.int64).view(bs, slots),
        "retrive_next_token": first,
        "retrive_next_sibling": sib,
        "uniform_samples": torch.rand(bs, slots, generator=gen),
        "uniform_samples_for_final_sampling": torch.rand(bs, generator=gen),
        "target_probs": probs.float().contiguous(),
        "draft_probs": torch.zeros(bs, slots, vocab),
    }


def run(fn: Callable[..., None], batch: Batch) -> Batch:
    out = {k: v.clone() for k, v in batch.items()}
    fn(**out)
    return out


def check_against_reference(batch: Batch, out: Batch) -> None:
    spec = int(batch["accept_index"].shape[1])
    for b in range(batch["candidates"].shape[0]):
        want_pred, want_path, k = reference(
            batch["candidates"][b].tolist(), batch["retrive_index"][b].tolist(),
            batch["retrive_next_token"][b].tolist(), batch["retrive_next_sibling"][b].tolist(),
            batch["uniform_samples"][b].tolist(),
            float(batch["uniform_samples_for_final_sampling"][b]), batch["target_probs"][b].tolist(), spec,
        )  # fmt: skip
        assert int(out["accept_token_num"][b]) == k
        assert out["accept_index"][b, : k + 1].tolist() == want_path
        assert out["accept_index"][b, k + 1 :].tolist() == [-7] * (spec - k - 1)  # untouched past the path
        got = {i: int(out["predicts"][i]) for i in want_pred}
        assert got == want_pred
        mine = batch["retrive_index"][b].tolist()
        assert all(int(out["predicts"][i]) == -7 for i in mine if i not in want_pred)  # nothing else written


def random_tree(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int]]:
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    toks = [rng.randrange(vocab) for _ in range(n)]
    for i in range(1, n):  # distinct sibling tokens, as top-k rows give
        while any(toks[j] == toks[i] for j in range(1, i) if parents[j] == parents[i]):
            toks[i] = (toks[i] + 1) % vocab
    return parents, toks


@pytest.mark.parametrize("spec", [16, 4])  # 4: the depth cap ends deep paths (bonus from the full row)
def test_trees_equal_the_reference_on_fixed_coins(spec: int) -> None:
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    vocab, slots = 12, 16
    trees = [random_tree(rng, rng.randrange(1, slots + 1), vocab) for _ in range(64)]
    # a quarter of the rows: the target puts most mass on the tree's tokens, so deep paths are accepted
    batch = make_batch(trees, slots, vocab, spec, gen)
    for b in range(0, 64, 4):
        parents, toks = trees[b]
        for i in range(1, len(toks)):
            batch["target_probs"][b, parents[i], toks[i]] += 3.0
        batch["target_probs"][b] /= batch["target_probs"][b].sum(-1, keepdim=True)
    out = run(ss.tree_speculative_sampling_target_only, batch)
    check_against_reference(batch, out)
    assert out["accept_token_num"].max() >= min(3, spec - 1)  # the test reaches deep paths


def chain_batch(bs: int, n: int, vocab: int, gen: torch.Generator, lift: float) -> Batch:
    """DFLASH's layout: node i's child is node i + 1; the target lifted toward the drafted tokens by `lift`."""
    toks = torch.randint(0, vocab, (bs, n), generator=gen)
    batch = make_batch([(list(range(-1, n - 1)), toks[b].tolist()) for b in range(bs)], n, vocab, n, gen)
    rows = torch.arange(bs)[:, None]
    batch["target_probs"][rows, torch.arange(n - 1)[None, :], toks[:, 1:]] += lift
    batch["target_probs"] /= batch["target_probs"].sum(-1, keepdim=True)
    return batch


@pytest.mark.parametrize("lift", [0.0, 1.0, 20.0])
def test_the_chain_version_equals_the_tree_version_and_the_reference(lift: float) -> None:
    gen = torch.Generator().manual_seed(2)
    batch = chain_batch(48, 16, 10, gen, lift)
    chain = run(ss.chain_speculative_sampling_target_only, batch)
    tree = run(ss.tree_speculative_sampling_target_only, batch)
    for key in ("predicts", "accept_index", "accept_token_num", "draft_probs"):
        assert torch.equal(chain[key], tree[key]), key
    check_against_reference(batch, chain)
    if lift == 20.0:
        assert int(chain["accept_token_num"].max()) == 15  # all accepted: the depth cap, bonus from the full row


def one_row(probs: list[list[float]], toks: list[int], coins: list[float], final: float) -> Batch:
    n = len(toks)
    batch = make_batch([(list(range(-1, n - 1)), toks)], n, len(probs[0]), n, torch.Generator().manual_seed(0),
                       probs=torch.tensor([probs]))  # fmt: skip
    batch["uniform_samples"] = torch.tensor([coins])
    batch["uniform_samples_for_final_sampling"] = torch.tensor([final])
    return batch


@pytest.mark.parametrize("fn", ["tree_speculative_sampling_target_only", "chain_speculative_sampling_target_only"])
def test_edge_cases(fn: str) -> None:
    impl = getattr(ss, fn)
    onehot = [[0.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    # greedy rows (one-hot): accepted whatever the coin when the draft is the argmax; the bonus is the argmax
    out = run(impl, one_row(onehot, [0, 2, 1], [0.999, 0.999, 0.999], 0.999))
    assert int(out["accept_token_num"][0]) == 2 and out["predicts"].tolist() == [2, 1, 0]
    out = run(impl, one_row(onehot, [0, 2, 3], [0.0, 0.0, 0.0], 0.0))  # the second draft is not the argmax
    assert int(out["accept_token_num"][0]) == 1 and out["predicts"].tolist()[:2] == [2, 1]
    # a drafted token of zero target mass is never accepted, even on coin 0; the bonus is never that token
    zero = [[0.5, 0.0, 0.5, 0.0], [0.25] * 4, [0.25] * 4]
    for final in (0.0, 0.3, 0.7, 0.9999):
        out = run(impl, one_row(zero, [0, 1, 2], [0.0, 0.0, 0.0], final))
        assert int(out["accept_token_num"][0]) == 0 and int(out["predicts"][0]) in (0, 2)
    # none accepted: the bonus avoids the rejected token even where the coin points at it
    rej = [[0.4, 0.6, 0.0, 0.0], [0.25] * 4, [0.25] * 4]
    out = run(impl, one_row(rej, [0, 1, 2], [0.99, 0.0, 0.0], 0.5))
    assert int(out["accept_token_num"][0]) == 0 and int(out["predicts"][0]) == 0
    # a row without mass (nothing left to draw): the kernel's fallback, the last vocabulary token
    nothing = [[0.0, 0.0, 0.0, 0.0], [0.25] * 4, [0.25] * 4]
    out = run(impl, one_row(nothing, [0, 1, 2], [0.0, 0.0, 0.0], 0.5))
    assert int(out["accept_token_num"][0]) == 0 and int(out["predicts"][0]) == 3


# ---------------------------------------------------------------- distribution

VOCAB = 4
# first-token target T1 (the root's row) and second-token targets T2[x] (what follows token x); a tree whose
# root has children tokens 1 and 2, node 1 (token 1) a child token 3, node 2 (token 2) children tokens 0 and 3
T1 = torch.tensor([0.1, 0.45, 0.3, 0.15])
T2 = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.1, 0.2, 0.6], [0.5, 0.1, 0.1, 0.3], [0.7, 0.1, 0.1, 0.1]])
TREE = ([-1, 0, 0, 1, 2, 2], [9, 1, 2, 3, 0, 3])  # token 9 at the root: the committed token before the round
CHAIN = ([-1, 0, 1], [9, 1, 3])
SAMPLES = 25_000  # 15 degrees of freedom: catches a total-variation error of 0.02 at alpha 1e-3 with power 0.9


def node_rows(parents: list[int], toks: list[int]) -> Tensor:
    """Each node's target row: the root's is T1, a node carrying token x has T2[x] (depth 2 is as deep as the
    test looks; deeper rows do not change the first two tokens)."""
    return torch.stack([T1 if i == 0 else T2[toks[i] % VOCAB] for i in range(len(parents))])


def joint_counts(fn: Callable[..., None], tree: tuple[list[int], list[int]], shared_coin: bool = False) -> Tensor:
    """Counts of the first two committed tokens over SAMPLES requests: the round's first two when it commits two
    or more, else the second drawn from T2[first] (the next round's target), as decoding would."""
    gen = torch.Generator().manual_seed(7)
    parents, toks = tree
    n = len(toks)
    rows = node_rows(parents, toks)
    toks_v = [t % VOCAB if i else 0 for i, t in enumerate(toks)]
    batch = make_batch([(parents, toks_v)] * SAMPLES, n, VOCAB, n, gen, probs=rows.expand(SAMPLES, -1, -1))
    if shared_coin:  # planted bug: one coin for every depth
        batch["uniform_samples"] = batch["uniform_samples"][:, :1].expand(-1, n).contiguous()
    out = run(fn, batch)
    pred = out["predicts"].view(SAMPLES, n).long()
    acc = out["accept_index"].long() % n
    first = pred.gather(1, acc[:, :1])[:, 0]
    second_in_round = pred.gather(1, acc[:, 1:2])[:, 0]
    second_next = torch.multinomial(T2[first], 1, generator=gen)[:, 0]
    second = torch.where(out["accept_token_num"] >= 1, second_in_round, second_next)
    return torch.bincount(first * VOCAB + second, minlength=VOCAB * VOCAB)


def chi_square_p(counts: Tensor, probs: Tensor) -> float:
    expected = counts.sum() * probs.double()
    keep = expected > 0
    assert (counts[~keep] == 0).all(), "a token of zero probability was committed"
    stat = ((counts[keep].double() - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0))


EXACT = (T1[:, None] * T2).flatten()
ALPHA = 1e-3


def per_sibling_accepts(coin: Tensor, running: Tensor, prob: Tensor, single: float, acc: float) -> Tensor:
    """Planted bug: each sibling tested against its own probability (min(1, p / q) with q = 1), not the running sum."""
    return (prob > 0) & (coin < prob / acc)


@pytest.mark.parametrize(
    ("fn", "tree"),
    [("tree_speculative_sampling_target_only", TREE), ("tree_speculative_sampling_target_only", CHAIN),
     ("chain_speculative_sampling_target_only", CHAIN)],
)  # fmt: skip
def test_committed_tokens_follow_the_target(fn: str, tree: tuple[list[int], list[int]]) -> None:
    assert chi_square_p(joint_counts(getattr(ss, fn), tree), EXACT) > ALPHA


@pytest.mark.parametrize("fn", ["tree_speculative_sampling_target_only", "chain_speculative_sampling_target_only"])
def test_the_distribution_test_rejects_one_coin_shared_across_depths(fn: str) -> None:
    tree = TREE if fn.startswith("tree") else CHAIN
    assert chi_square_p(joint_counts(getattr(ss, fn), tree, shared_coin=True), EXACT) < ALPHA


def test_the_distribution_test_rejects_siblings_without_the_running_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ss, "_accepts", per_sibling_accepts)
    assert chi_square_p(joint_counts(ss.tree_speculative_sampling_target_only, TREE), EXACT) < ALPHA


# ---------------------------------------------------------------- inside SGLang's DFLASH verify (G6)

G6_SCRIPT = r"""
import json, os, sys
sys.path.append(sys.argv[1])  # after SGLang's own path: the stand-in's sgl_kernel must not shadow the CPU stub
import torch
import gpu_patches, spec_sampling
from types import SimpleNamespace
from sglang.srt.speculative import dflash_utils as du
gpu_patches._patch_dflash_utils(du)
out = {"available": du.is_dflash_sampling_verify_available(), "applied": gpu_patches.APPLIED}
if out["available"]:
    bs, n, vocab = 6, 5, 9
    gen = torch.Generator().manual_seed(3)
    cand = torch.randint(0, vocab, (bs, n), generator=gen)
    logits = torch.randn(bs * n, vocab, generator=gen) * 3
    logits[torch.arange(bs * n), cand.roll(-1, 1).flatten()] += 4  # the drafts likely: deep paths too
    info = SimpleNamespace(
        temperatures=torch.full((bs, 1), 0.7), top_ks=torch.full((bs,), vocab, dtype=torch.int32),
        top_ps=torch.ones(bs), need_top_k_sampling=False, need_top_p_sampling=False, need_min_p_sampling=False,
        vocab_size=vocab, is_all_greedy=False,
    )
    coins, final = torch.rand(bs, n, generator=gen), torch.rand(bs, generator=gen)
    accept, bonus = du.compute_dflash_sampling_correct_drafts_and_bonus(
        candidates=cand, next_token_logits=logits, sampling_info=info, threshold_single=1.0, threshold_acc=1.0,
        uniform_samples=coins, uniform_samples_for_final_sampling=final,
    )
    # the same round through the stand-in's function directly, on the target SGLang builds (softmax at T 0.7)
    k = dict(predicts=torch.zeros(bs * n, dtype=torch.int32), accept_index=torch.zeros(bs, n, dtype=torch.int32),
             accept_token_num=torch.zeros(bs, dtype=torch.int32))
    spec_sampling.tree_speculative_sampling_target_only(
        **k, candidates=cand, retrive_index=torch.arange(bs * n).view(bs, n),
        retrive_next_token=torch.tensor([[*range(1, n), -1]] * bs), retrive_next_sibling=torch.full((bs, n), -1),
        uniform_samples=coins, uniform_samples_for_final_sampling=final,
        target_probs=torch.softmax(logits / 0.7, -1).view(bs, n, vocab), draft_probs=torch.zeros(bs, n, vocab),
    )
    want = k["predicts"].view(bs, n).gather(1, k["accept_token_num"].long()[:, None])[:, 0]
    out.update(accept=accept.tolist(), bonus=bonus.tolist(), want_accept=k["accept_token_num"].tolist(),
               want_bonus=want.tolist())
print("G6 " + json.dumps(out))
"""


def run_g6(env: dict[str, str]) -> dict[str, object]:
    import json
    import os
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sglang_cpu

    reason = sglang_cpu.sglang_skip_reason()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, "-c", sglang_cpu.PRELUDE + G6_SCRIPT, str(PATH.parent)],
        capture_output=True, text=True, timeout=300, env={**os.environ, **env},
    )  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("G6 ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][3:])


def test_dflash_samples_through_the_stand_in_inside_sglang() -> None:
    got = run_g6({"DDTREE_DEV_GREEDY_DFLASH_VERIFY": "0"})
    assert got["available"] is True and got["applied"] == ["G6"]
    assert got["accept"] == got["want_accept"] and got["bonus"] == got["want_bonus"]
    assert max(got["accept"]) >= 1  # type: ignore[type-var]  # some drafts accepted: the path is exercised
    off = run_g6({"DDTREE_DEV_GREEDY_DFLASH_VERIFY": "1"})
    assert off["available"] is False and off["applied"] == ["G6"]
