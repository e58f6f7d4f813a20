"""ddtree.sglang.layout: a DDTree tree in SGLang's EAGLE tree layout, checked against ddtree.tree's own
compile_tree / walk_tree on the same inputs (off-spine acceptance included) and, where SGLang is installed,
against SGLang 0.5.23's own Triton kernels run by Triton's CPU interpreter: tree build and greedy verify, and
the Gated DeltaNet tree kernels (causal conv + recurrent update) that make tree verify exact on hybrids."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from ddtree.sglang.devcheck import VOCAB, path_logits, random_tree
from ddtree.sglang.layout import (
    bfs_order,
    eagle_selection,
    full_mask,
    greedy_accept,
    kv_commit,
    qlen_mask,
    stack_links,
    to_sglang_layout,
)
from ddtree.tree import compile_tree, is_off_spine, walk_tree

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sglang_cpu import Probe, ProbeResult  # noqa: E402

sys.path.remove(str(HERE))


CASES = [(seed, budget, topk) for seed in range(6) for budget, topk in ((1, 1), (5, 1), (12, 3), (31, 4), (40, 8))]


@pytest.mark.parametrize(("seed", "budget", "topk"), CASES)
def test_layout_is_bfs_with_contiguous_siblings(seed: int, budget: int, topk: int) -> None:
    tree = random_tree(seed, budget, topk)
    lay = to_sglang_layout(tree, prefix_len=7)
    n = tree.num_nodes
    assert sorted(lay.order.tolist()) == list(range(n))
    parents, depths = lay.parents.tolist(), lay.depths.tolist()
    assert parents[0] == -1 and depths[0] == 0
    assert all(parents[i] < i for i in range(1, n)), "parent before child"
    assert depths == sorted(depths), "BFS: depth never decreases along slots"
    assert [parents[i] for i in range(1, n)] == sorted(parents[1:]), "siblings contiguous, parents in order"
    # next_token = smallest child slot; next_sibling chains ascend through all children of a slot
    for p in range(n):
        kids = [i for i in range(1, n) if parents[i] == p]
        chain, c = [], int(lay.retrieve_next_token[p])
        while c != -1:
            chain.append(c)
            c = int(lay.retrieve_next_sibling[c])
        assert chain == kids
    # within a parent, slots keep DDTree id order (= the drafter's rank order)
    order = lay.order.tolist()
    for p in range(n):
        ids = [order[i] for i in range(1, n) if parents[i] == p]
        assert ids == sorted(ids)


@pytest.mark.parametrize(("seed", "budget", "topk"), CASES)
def test_layout_matches_compile_tree(seed: int, budget: int, topk: int) -> None:
    tree = random_tree(seed, budget, topk)
    prefix_len = 3 + seed
    ref = compile_tree(tree, prefix_len)
    lay = to_sglang_layout(tree, prefix_len)
    o = lay.order
    assert torch.equal(lay.draft_tokens, tree.tokens[o])
    assert torch.equal(lay.positions, ref.position_ids[o])
    assert torch.equal(lay.tree_mask, ref.attention_mask[o][:, o])
    slot_of = lay.slot_of
    assert torch.equal(slot_of[o], torch.arange(tree.num_nodes))
    expected_parents = torch.where(tree.parents[o] < 0, -1, slot_of[tree.parents[o].clamp(min=0)])
    assert torch.equal(lay.parents, expected_parents)


def test_greedy_accept_matches_walk_tree_including_off_spine() -> None:
    off_spine = deeper = 0
    for seed, budget, topk in CASES:
        tree = random_tree(seed, budget, topk)
        lay = to_sglang_layout(tree, prefix_len=11)
        for trial in range(4):
            logits = path_logits(tree, seed=100 * seed + trial) if trial else torch.randn(tree.num_nodes, VOCAB)
            ref = walk_tree(tree, logits)
            got = greedy_accept(lay, logits.argmax(-1)[lay.order])
            assert tuple(lay.order[list(got.accept_slots)].tolist()) == ref.accepted
            assert got.bonus_token == ref.bonus_token
            assert got.tau == len(ref.accepted)
            off_spine += is_off_spine(tree, ref.accepted)
            deeper += len(ref.accepted) > 2
    assert off_spine >= 10, "the cases must exercise off-spine acceptance"
    assert deeper >= 10, "and paths longer than one drafted token"


def test_kv_commit_keeps_the_path_and_frees_the_rest() -> None:
    tree = random_tree(seed=3, budget=31, topk=4)
    lay = to_sglang_layout(tree, prefix_len=20)
    logits = path_logits(tree, seed=7)
    acc = greedy_accept(lay, logits.argmax(-1)[lay.order])
    assert acc.tau >= 2
    loc = torch.arange(1000, 1000 + lay.num_slots) * 3  # arbitrary distinct cache locations
    kv = kv_commit(lay, acc, loc)
    assert kv.kept_cache_loc.tolist() == [int(loc[s]) for s in acc.accept_slots]
    assert sorted(kv.kept_cache_loc.tolist() + kv.freed_cache_loc.tolist()) == loc.tolist()
    assert kv.hidden_rows.tolist() == list(acc.accept_slots)
    assert kv.last_step == acc.accept_slots[-1]
    # the kept entries land at consecutive positions: the accepted path's depths are 0..tau-1
    assert lay.positions[list(acc.accept_slots)].tolist() == list(range(20, 20 + acc.tau))


def test_padding_slots_are_unreachable_and_change_nothing() -> None:
    tree = random_tree(seed=1, budget=12, topk=3)
    plain = to_sglang_layout(tree, prefix_len=5)
    padded = to_sglang_layout(tree, prefix_len=5, num_slots=plain.num_slots + 4)
    n = plain.num_slots
    assert padded.num_nodes == n and padded.num_slots == n + 4
    assert torch.equal(padded.tree_mask[:n, :n], plain.tree_mask)
    assert not padded.tree_mask[:n, n:].any(), "no real node sees a padding slot"
    for i in range(n, n + 4):
        assert padded.tree_mask[i].nonzero().flatten().tolist() == [0, i]
    assert (padded.retrieve_next_token[n:] == -1).all() and (padded.retrieve_next_sibling[n:] == -1).all()
    linked = set(padded.retrieve_next_token.tolist()) | set(padded.retrieve_next_sibling.tolist())
    assert linked.isdisjoint(range(n, n + 4))
    for trial in range(5):
        predict = torch.randint(VOCAB, (n + 4,), generator=torch.Generator().manual_seed(trial))
        predict[n:] = padded.draft_tokens[n:]  # tempt the walk with the padding's own token
        assert greedy_accept(padded, predict) == greedy_accept(plain, predict[:n])
    with pytest.raises(ValueError, match="smaller than the tree"):
        to_sglang_layout(tree, prefix_len=5, num_slots=n - 1)


def test_batch_masks_follow_sglang_flattening() -> None:
    trees = [random_tree(seed=s, budget=9, topk=3) for s in range(3)]
    lays = [to_sglang_layout(t, prefix_len=0, num_slots=10) for t in trees]
    prefix = [4, 0, 7]
    flat = full_mask(lays, prefix)
    s = 10
    assert flat.shape == (sum(s * (p + s) for p in prefix),)
    offset = 0
    for lay, p in zip(lays, prefix, strict=True):
        block = flat[offset : offset + s * (p + s)].view(s, p + s)
        assert block[:, :p].all()
        assert torch.equal(block[:, p:], lay.tree_mask)
        offset += s * (p + s)
    assert torch.equal(qlen_mask(lays).view(3, s, s), torch.stack([lay.tree_mask for lay in lays]))
    index, nt, ns = stack_links(lays)
    assert index.tolist() == [list(range(b * s, (b + 1) * s)) for b in range(3)]
    assert torch.equal(nt[1], lays[1].retrieve_next_token) and torch.equal(ns[2], lays[2].retrieve_next_sibling)
    with pytest.raises(ValueError, match="same number of slots"):
        full_mask([lays[0], to_sglang_layout(trees[1], 0, num_slots=11)], [1, 1])


def test_bfs_order_rejects_a_child_before_its_parent() -> None:
    with pytest.raises(ValueError, match="must come first"):
        bfs_order(torch.tensor([-1, 2, 0]), torch.tensor([0, 2, 1]))


def test_eagle_selection_enumerates_slots_in_order() -> None:
    tree = random_tree(seed=4, budget=31, topk=4)
    lay = to_sglang_layout(tree, prefix_len=0)
    parent_list, selected = eagle_selection(lay, topk=4)
    assert selected.tolist() == sorted(selected.tolist())
    assert len(set(selected.tolist())) == lay.num_nodes - 1
    # decode it the way SGLang's kernel does: group = index // topk, group 0 = the root
    pos = {c: i + 1 for i, c in enumerate(selected.tolist())}
    for i, c in enumerate(selected.tolist(), start=1):
        g = c // 4
        parent_slot = 0 if g == 0 else pos[int(parent_list[g])]
        assert parent_slot == int(lay.parents[i])


# ---------------------------------------------------------------------------------------------------
# Against SGLang's own kernels: `python -m ddtree.sglang.devcheck` under Triton's CPU interpreter, in the tier's one
# SGLang probe process (conftest.py, `sglang_probes`: TRITON_INTERPRET is set there before triton is imported; SGLang
# is only imported there).
# ---------------------------------------------------------------------------------------------------


def sglang_probe(tmp: Path) -> Probe:
    return Probe("from ddtree.sglang.devcheck import main\nraise SystemExit(main(['--device', 'cpu', '--small']))")


@pytest.fixture(scope="module")
def devcheck(sglang_probes: dict[str, ProbeResult]) -> dict[str, Any]:
    done = sglang_probes[__name__]
    assert done.stdout, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    report["returncode"] = done.returncode
    return report


def test_layout_equals_sglang_build_tree_and_verify_greedy(devcheck: dict[str, Any]) -> None:
    """SGLang's build_tree kernel, fed our tree, produces our mask, positions and links bit for bit; its
    verify_tree_greedy kernel accepts the same path as walk_tree (off-spine included)."""
    runs = devcheck["tree_kernels"]
    assert len(runs) == 2
    for run in runs:
        assert {k: run[k] for k in ("mask", "positions", "links", "accept", "walk")} == dict.fromkeys(
            ("mask", "positions", "links", "accept", "walk"), True
        )
    assert sum(r["off_spine"] for r in runs) >= 1
    assert max(max(r["accepted_drafts"]) for r in runs) >= 2


def test_sglang_gdn_tree_kernels_are_exact_on_our_layout(devcheck: dict[str, Any]) -> None:
    """SGLang's hybrid tree path, fed our links: every node's conv output, conv window (the commit state),
    recurrent output and recurrent state equal the same kernels run on that node's root-to-node chain alone.
    The flat order (no links) does not, so the links are what makes it exact."""
    (run,) = devcheck["gdn"]
    assert run["parents"], "the conv kernel rebuilds our parents from next_token/next_sibling"
    assert run["nodes"] == 10 and run["max_depth"] >= 2
    err = run["err"]
    assert max(err["conv"], err["window"], err["gdn"], err["state"]) < 1e-5
    assert min(err["flat_conv"], err["flat_gdn"]) > 1e-2
    assert devcheck["passed"] and devcheck["returncode"] == 0
