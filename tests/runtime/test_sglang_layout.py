"""ddtree.sglang.layout: a DDTree tree in SGLang's EAGLE tree layout, checked against ddtree.tree's own
compile_tree / walk_tree on the same inputs (off-spine acceptance included) and, where SGLang is installed,
against SGLang 0.5.23's own Triton kernels run by Triton's CPU interpreter: tree build and greedy verify, and
the Gated DeltaNet tree kernels (causal conv + recurrent update) that make tree verify exact on hybrids."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddtree.sglang.layout import (
    SGLangTreeLayout,
    accept_tensors,
    bfs_order,
    eagle_selection,
    full_mask,
    greedy_accept,
    kv_commit,
    qlen_mask,
    stack_links,
    to_sglang_layout,
)
from ddtree.tree import DraftTree, build_tree, compile_tree, is_off_spine, walk_tree

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
VOCAB = 50


def random_tree(seed: int, budget: int, topk: int, rows: int = 6) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(rows, VOCAB, generator=g) * 2).log_softmax(-1)  # [D, V]
    return build_tree(lp, root_token=int(torch.randint(VOCAB, (1,), generator=g)), budget=budget, topk=topk)


def path_logits(tree: DraftTree, seed: int) -> torch.Tensor:
    """[N, V] target logits that make the walk follow a random root-to-leaf path (often off the spine) and
    then miss; rows off the path are random."""
    g = torch.Generator().manual_seed(seed)
    n = tree.num_nodes
    logits = torch.randn(n, VOCAB, generator=g)
    parents = tree.parents.tolist()
    node = int(torch.randint(n, (1,), generator=g))  # walk up from a random node to get a path
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    path.reverse()  # root .. node
    for parent, child in itertools.pairwise(path):
        logits[parent, int(tree.tokens[child])] = 100.0
    children = {int(tree.tokens[c]) for c in range(1, n) if parents[c] == node}
    miss = next(t for t in range(VOCAB) if t not in children)
    logits[node, miss] = 100.0
    return logits


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
# Against SGLang's own kernels (Triton's CPU interpreter), in a subprocess: TRITON_INTERPRET must be set
# before triton is imported, and the kernels are SGLang 0.5.23's real code.
# ---------------------------------------------------------------------------------------------------

_SGLANG_KERNELS = """
import json, sys, torch
from sglang.kernels.ops.speculative.spec_tree import (
    sgl_build_tree_kernel_triton, verify_tree_greedy_triton, TreeMaskMode,
)
req = json.load(sys.stdin)
bs, n, topk, depth = req["bs"], req["n"], req["topk"], req["depth"]
seq_lens = torch.tensor(req["seq_lens"], dtype=torch.int64)
g = max(len(p) for p in req["parent_list"])
parent_list = torch.tensor([p + [0] * (g - len(p)) for p in req["parent_list"]], dtype=torch.int64)
selected = torch.tensor(req["selected"], dtype=torch.int64)
mask = torch.ones(int(seq_lens.sum()) * n + n * n * bs, dtype=torch.bool)
positions = torch.empty(bs * n, dtype=torch.int64)
idx, nt, ns = torch.full((3, bs, n), -1, dtype=torch.int64)
sgl_build_tree_kernel_triton(parent_list, selected, seq_lens, mask, positions, idx, nt, ns,
                             topk, depth, n, TreeMaskMode.FULL_MASK)
candidates = torch.tensor(req["candidates"], dtype=torch.int64)
target = torch.tensor(req["target_predict"], dtype=torch.int64)
predicts = torch.full((bs * n,), -1, dtype=torch.int64)
accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int64)
accept_num = torch.zeros(bs, dtype=torch.int64)
verify_tree_greedy_triton(predicts, accept_index, accept_num, candidates, idx, nt, ns, target)
json.dump({"mask": mask.int().tolist(), "positions": positions.tolist(), "index": idx.tolist(),
           "next_token": nt.tolist(), "next_sibling": ns.tolist(), "predicts": predicts.tolist(),
           "accept_index": accept_index.tolist(), "accept_num": accept_num.tolist()}, sys.stdout)
"""


@pytest.fixture(scope="module")
def sglang_prelude() -> str:
    sys.path.insert(0, str(HERE))
    try:
        from sglang_cpu import PRELUDE, sglang_skip_reason
    finally:
        sys.path.remove(str(HERE))
    reason = sglang_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return PRELUDE


def run_sglang_kernels(prelude: str, request: dict[str, object]) -> dict[str, list[int]]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", prelude + _SGLANG_KERNELS],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, list[int]] = json.loads(done.stdout)
    return result


def test_layout_equals_sglang_build_tree_and_verify_greedy(sglang_prelude: str) -> None:
    """SGLang's build_tree kernel, fed the same tree, produces our mask, positions and links bit for bit;
    its verify_tree_greedy kernel accepts the same path (off-spine included) as walk_tree."""
    budget, topk, depth = 14, 3, 6
    trees = [random_tree(seed=s, budget=budget, topk=topk, rows=depth) for s in (0, 1, 2, 5)]
    assert all(t.num_nodes == budget + 1 for t in trees)
    seq_lens = [5, 0, 9, 3]
    lays: list[SGLangTreeLayout] = [to_sglang_layout(t, p) for t, p in zip(trees, seq_lens, strict=True)]
    logits = [path_logits(t, seed=40 + i) for i, t in enumerate(trees)]
    predict = [lg.argmax(-1)[lay.order] for lg, lay in zip(logits, lays, strict=True)]
    selections = [eagle_selection(lay, topk) for lay in lays]
    got = run_sglang_kernels(
        sglang_prelude,
        {
            "bs": len(lays),
            "n": budget + 1,
            "topk": topk,
            "depth": depth,
            "seq_lens": seq_lens,
            "parent_list": [p.tolist() for p, _ in selections],
            "selected": [s.tolist() for _, s in selections],
            "candidates": [lay.draft_tokens.tolist() for lay in lays],
            "target_predict": [p.tolist() for p in predict],
        },
    )
    assert got["mask"] == full_mask(lays, seq_lens).int().tolist()
    assert got["positions"] == torch.cat([lay.positions for lay in lays]).tolist()
    index, nt, ns = stack_links(lays)
    assert got["index"] == index.tolist()
    assert got["next_token"] == nt.tolist()
    assert got["next_sibling"] == ns.tolist()

    accepts = [greedy_accept(lay, p) for lay, p in zip(lays, predict, strict=True)]
    acc_index, acc_num, predicts = accept_tensors(accepts, predict, budget + 1, depth + 1)
    assert got["accept_index"] == acc_index.tolist()
    assert got["accept_num"] == acc_num.tolist()
    assert got["predicts"] == predicts.tolist()
    for tree, lay, lg, acc in zip(trees, lays, logits, accepts, strict=True):
        assert tuple(lay.order[list(acc.accept_slots)].tolist()) == walk_tree(tree, lg).accepted
    assert any(is_off_spine(t, walk_tree(t, lg).accepted) for t, lg in zip(trees, logits, strict=True))


_SGLANG_GDN_KERNELS = """
import json, sys, torch
from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
    fused_sigmoid_gating_delta_rule_update,
)
req = json.load(sys.stdin)
nt = torch.tensor([req["next_token"]], dtype=torch.int64)  # [1, T]
ns = torch.tensor([req["next_sibling"]], dtype=torch.int64)
T = nt.shape[1]
g = torch.Generator().manual_seed(0)
dim, width, H, K, V = 24, 4, 2, 8, 8
x = torch.randn(1, dim, T, generator=g)  # [bs, dim, T] as the GDN backend lays out mixed_qkv
w, bias = torch.randn(dim, width, generator=g) * 0.5, torch.randn(dim, generator=g) * 0.1
conv0 = torch.randn(1, dim, width - 1, generator=g)  # the committed conv window
q, k = torch.randn(1, T, H, K, generator=g), torch.randn(1, T, H, K, generator=g)
v = torch.randn(1, T, H, V, generator=g)
a, b = torch.randn(T, H, generator=g), torch.randn(T, H, generator=g)
A_log, dt_bias = torch.randn(H, generator=g) * 0.3, torch.randn(H, generator=g) * 0.3
h0 = torch.randn(1, H, V, K, generator=g) * 0.5  # the committed recurrent state
zero = torch.zeros(1, dtype=torch.int32)

def conv(xs, tree):
    n = xs.shape[-1]
    inter = torch.zeros(1, n, dim, width - 1)
    links = dict(retrieve_next_token=nt, retrieve_next_sibling=ns,
                 retrieve_parent_token=torch.zeros(1, n, dtype=torch.int64)) if tree else {}
    out = causal_conv1d_update(xs.clone(), conv0.clone(), w, bias, "silu", conv_state_indices=zero,
                               intermediate_conv_window=inter, intermediate_state_indices=zero, **links)
    return out[0], inter[0], links.get("retrieve_parent_token")

def gdn(idx, parent):
    n = len(idx)
    inter = torch.zeros(1, n, H, V, K)
    o = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a[idx].contiguous(), dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=q[:, idx].contiguous(), k=k[:, idx].contiguous(), v=v[:, idx].contiguous(), b=b[idx].contiguous(),
        initial_state_source=h0.clone(), initial_state_indices=zero,
        cu_seqlens=torch.tensor([0, n], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
        disable_state_update=True, intermediate_states_buffer=inter, intermediate_state_indices=zero,
        cache_steps=n, retrieve_parent_token=parent)
    return o.reshape(n, H, V), inter[0]

out_t, win_t, parent = conv(x, tree=True)
o_t, st_t = gdn(list(range(T)), parent)
out_flat, _, _ = conv(x, tree=False)
o_flat, _ = gdn(list(range(T)), None)
err = dict(conv=0.0, window=0.0, gdn=0.0, state=0.0, flat_conv=0.0, flat_gdn=0.0)
for slot, path in enumerate(req["paths"]):  # each node against its own root-to-node chain
    out_c, win_c, _ = conv(x[:, :, path], tree=False)
    o_c, st_c = gdn(path, None)
    err["conv"] = max(err["conv"], (out_c[:, -1] - out_t[:, slot]).abs().max().item())
    err["window"] = max(err["window"], (win_c[-1] - win_t[slot]).abs().max().item())
    err["gdn"] = max(err["gdn"], (o_c[-1] - o_t[slot]).abs().max().item())
    err["state"] = max(err["state"], (st_c[-1] - st_t[slot]).abs().max().item())
    err["flat_conv"] = max(err["flat_conv"], (out_c[:, -1] - out_flat[:, slot]).abs().max().item())
    err["flat_gdn"] = max(err["flat_gdn"], (o_c[-1] - o_flat[slot]).abs().max().item())
json.dump({"parents": parent[0].tolist(), "err": err}, sys.stdout)
"""


def test_sglang_gdn_tree_kernels_are_exact_on_our_layout(sglang_prelude: str) -> None:
    """SGLang's hybrid tree path, fed our links: every node's conv output, conv window (the commit state),
    recurrent output and recurrent state equal the same kernels run on that node's root-to-node chain alone.
    The flat order (no links) does not, so the links are what makes it exact."""
    tree = random_tree(seed=3, budget=9, topk=3, rows=5)
    lay = to_sglang_layout(tree, prefix_len=0)
    par = lay.parents.tolist()
    paths = []
    for slot in range(lay.num_slots):
        path = [slot]
        while par[path[-1]] >= 0:
            path.append(par[path[-1]])
        paths.append(path[::-1])
    assert max(len(p) for p in paths) >= 3 and len(lay.retrieve_next_sibling.nonzero()) >= 2
    request = {
        "next_token": lay.retrieve_next_token.tolist(),
        "next_sibling": lay.retrieve_next_sibling.tolist(),
        "paths": paths,
    }
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", sglang_prelude + _SGLANG_GDN_KERNELS],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["parents"] == [0, *par[1:]], "the kernel rebuilds our parents from next_token/next_sibling"
    err = got["err"]
    assert err["conv"] < 1e-5 and err["window"] < 1e-6
    assert err["gdn"] < 1e-5 and err["state"] < 1e-5
    assert err["flat_conv"] > 1e-2 and err["flat_gdn"] > 1e-2
