"""Run the installed SGLang's own tree kernels on DDTree trees laid out by `ddtree.sglang.layout`.

    python -m ddtree.sglang.devcheck [--device cuda|cpu]     # prints JSON; exit 1 on any mismatch

On a GPU host the Triton kernels are compiled; on a CPU run it with TRITON_INTERPRET=1 set before start (the
tests do, in tests/runtime/test_sglang_layout.py). Two checks:

1. tree build + greedy verify: SGLang's `build_tree_kernel_efficient` Triton kernel, given our tree (through
   `eagle_selection`), must produce our FULL_MASK mask, positions and retrieve_* links exactly, and its
   `verify_tree_greedy` Triton kernel must accept our greedy path (= `walk_tree`'s, off-spine included).
2. hybrid (Gated DeltaNet) tree path: SGLang's `causal_conv1d_update` and
   `fused_sigmoid_gating_delta_rule_update`, fed our links, must give every node the conv output, conv window,
   recurrent output and recurrent state of its own root-to-node chain; the flat order must not.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any

import torch
from torch import Tensor

from ddtree.sglang.layout import (
    SGLangTreeLayout,
    accept_tensors,
    eagle_selection,
    full_mask,
    greedy_accept,
    stack_links,
    to_sglang_layout,
)
from ddtree.sglang.tree_round import TreeRound
from ddtree.tree import DraftTree, build_tree, is_off_spine, walk_tree

VOCAB = 50
# a per-path chain and the tree run the same arithmetic; in 16-bit activations their roundings may still differ
TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 5e-3}


def random_tree(seed: int, budget: int, topk: int, rows: int = 6) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(rows, VOCAB, generator=g) * 2).log_softmax(-1)  # [D, V]
    return build_tree(lp, root_token=int(torch.randint(VOCAB, (1,), generator=g)), budget=budget, topk=topk)


def path_logits(tree: DraftTree, seed: int) -> Tensor:
    """[N, V] target logits whose greedy walk follows a random root-to-node path (often off the spine)."""
    g = torch.Generator().manual_seed(seed)
    n = tree.num_nodes
    logits = torch.randn(n, VOCAB, generator=g)
    parents = tree.parents.tolist()
    node = int(torch.randint(n, (1,), generator=g))
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    path.reverse()
    for parent, child in itertools.pairwise(path):
        logits[parent, int(tree.tokens[child])] = 100.0
    children = {int(tree.tokens[c]) for c in range(1, n) if parents[c] == node}
    logits[node, next(t for t in range(VOCAB) if t not in children)] = 100.0
    return logits


def random_path_verify(plan: TreeRound, vocab: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """What SGLang's greedy tree verify returns when the target follows a random root-to-node path per request
    (often off the spine): (accept_index [bs, S] int32, accept_num [bs] int32, target_predict [bs, S] int64), from
    the reference layouts on the host."""
    g = torch.Generator().manual_seed(seed)
    bs, slots = plan.tokens.shape
    predict = torch.randint(0, vocab, (bs, slots), generator=g)
    for b, lay in enumerate(plan.layouts):
        node = int(torch.randint(lay.num_nodes, (1,), generator=g))
        parents = lay.parents.tolist()
        while parents[node] >= 0:
            predict[b, parents[node]] = lay.draft_tokens[node]
            node = parents[node]
    accepts = [greedy_accept(lay, predict[b]) for b, lay in enumerate(plan.layouts)]
    index, num, _ = accept_tensors(accepts, list(predict), slots, slots)
    return index.to(torch.int32), num.to(torch.int32), predict


def root_paths(layout: SGLangTreeLayout) -> list[list[int]]:
    """Per slot, the slots from the root to it."""
    parents = layout.parents.tolist()
    paths = []
    for slot in range(layout.num_slots):
        path = [slot]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        paths.append(path[::-1])
    return paths


def check_tree_kernels(device: str, budget: int, topk: int, depth: int, seeds: list[int]) -> dict[str, Any]:
    """One batch (one request per seed) through SGLang's tree-build and greedy-verify Triton kernels."""
    from sglang.kernels.ops.speculative.spec_tree import (
        TreeMaskMode,
        sgl_build_tree_kernel_triton,
        verify_tree_greedy_triton,
    )

    trees = [random_tree(s, budget, topk, depth) for s in seeds]
    if any(t.num_nodes != budget + 1 for t in trees):
        raise ValueError("EAGLE's tree kernels need every request at exactly budget + 1 nodes")
    bs, n = len(trees), budget + 1
    seq_lens = [3 * s % 11 for s in seeds]
    lays = [to_sglang_layout(t, p) for t, p in zip(trees, seq_lens, strict=True)]
    logits = [path_logits(t, 1000 + s) for t, s in zip(trees, seeds, strict=True)]
    predict = [lg.argmax(-1)[lay.order] for lg, lay in zip(logits, lays, strict=True)]  # [S] each
    selections = [eagle_selection(lay, topk) for lay in lays]
    groups = max(p.shape[0] for p, _ in selections)
    parent_list = torch.stack([torch.cat([p, p.new_zeros(groups - p.shape[0])]) for p, _ in selections])

    def on(x: Tensor) -> Tensor:
        return x.to(device)

    mask = torch.ones(sum(seq_lens) * n + n * n * bs, dtype=torch.bool, device=device)
    positions = torch.empty(bs * n, dtype=torch.int64, device=device)
    index, next_token, next_sibling = torch.full((3, bs, n), -1, dtype=torch.int64, device=device)
    sgl_build_tree_kernel_triton(
        on(parent_list),
        on(torch.stack([s for _, s in selections])),
        on(torch.tensor(seq_lens)),
        mask,
        positions,
        index,
        next_token,
        next_sibling,
        topk,
        depth,
        n,
        TreeMaskMode.FULL_MASK,
    )
    predicts = torch.full((bs * n,), -1, dtype=torch.int64, device=device)
    accept_index = torch.full((bs, depth + 1), -1, dtype=torch.int64, device=device)
    accept_num = torch.zeros(bs, dtype=torch.int64, device=device)
    verify_tree_greedy_triton(
        predicts,
        accept_index,
        accept_num,
        on(torch.stack([lay.draft_tokens for lay in lays])),
        index,
        next_token,
        next_sibling,
        on(torch.stack(predict)),
    )

    ours_index, ours_nt, ours_ns = stack_links(lays)
    accepts = [greedy_accept(lay, p) for lay, p in zip(lays, predict, strict=True)]
    ours_accept, ours_num, ours_predicts = accept_tensors(accepts, predict, n, depth + 1)
    walks = [walk_tree(t, lg).accepted for t, lg in zip(trees, logits, strict=True)]
    return {
        "mask": torch.equal(mask.cpu(), full_mask(lays, seq_lens)),
        "positions": torch.equal(positions.cpu(), torch.cat([lay.positions for lay in lays])),
        "links": torch.equal(index.cpu(), ours_index)
        and torch.equal(next_token.cpu(), ours_nt)
        and torch.equal(next_sibling.cpu(), ours_ns),
        "accept": torch.equal(accept_index.cpu(), ours_accept)
        and torch.equal(accept_num.cpu(), ours_num)
        and torch.equal(predicts.cpu(), ours_predicts),
        "walk": all(
            tuple(lay.order[list(acc.accept_slots)].tolist()) == walk
            for lay, acc, walk in zip(lays, accepts, walks, strict=True)
        ),
        "off_spine": sum(is_off_spine(t, w) for t, w in zip(trees, walks, strict=True)),
        "accepted_drafts": accept_num.cpu().tolist(),
    }


def check_gdn_kernels(
    device: str,
    seed: int,
    budget: int,
    topk: int,
    rows: int,
    dims: tuple[int, int, int, int],
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """SGLang's GDN tree kernels on one tree vs the same kernels on each root-to-node chain.
    dims = (conv channels, heads, key dim, value dim); `dtype`: the activations' and conv windows' dtype (the
    model's), recurrent states stay float32."""
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    dim, heads, kdim, vdim = dims
    width = 4  # the GDN short-conv kernel size
    lay = to_sglang_layout(random_tree(seed, budget, topk, rows), prefix_len=0)
    paths = root_paths(lay)
    t = lay.num_slots
    links = (lay.retrieve_next_token[None].to(device), lay.retrieve_next_sibling[None].to(device))  # [1, T]
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    x = rnd(1, dim, t)  # [bs, dim, T]: mixed_qkv as the GDN backend lays it out for the conv
    weight, bias, conv0 = rnd(dim, width, scale=0.5), rnd(dim, scale=0.1), rnd(1, dim, width - 1)
    q, k, v = rnd(1, t, heads, kdim), rnd(1, t, heads, kdim), rnd(1, t, heads, vdim)
    a, b = rnd(t, heads), rnd(t, heads)
    a_log, dt_bias = rnd(heads, scale=0.3).float(), rnd(heads, scale=0.3).float()
    h0 = rnd(1, heads, vdim, kdim, scale=0.5).float()
    zero = torch.zeros(1, dtype=torch.int32, device=device)

    def conv(xs: Tensor, tree: bool, chain_layout: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
        n = xs.shape[-1]
        # per-step conv window (the commit state); chain_layout: SGLang's deduplicated CUDA layout for chains
        # (`mem_cache/memory_pool.py:598`: step t's window is columns t .. t + K - 2 of one shared buffer)
        if chain_layout:
            shared = torch.zeros(1, dim, n + width - 2, device=device, dtype=dtype)
            window = shared.as_strided((1, n, dim, width - 1), (shared.stride(0), 1, shared.stride(1), 1))
        else:
            window = torch.zeros(1, n, dim, width - 1, device=device, dtype=dtype)
        parent = torch.zeros(1, n, dtype=torch.int64, device=device) if tree else None
        kw: dict[str, Any] = {}
        if tree:
            kw = {"retrieve_next_token": links[0], "retrieve_next_sibling": links[1], "retrieve_parent_token": parent}
        out = causal_conv1d_update(
            xs.clone().contiguous(),
            conv0.clone(),
            weight,
            bias,
            "silu",
            conv_state_indices=zero,
            intermediate_conv_window=window,
            intermediate_state_indices=zero,
            **kw,
        )
        return out[0], window[0].clone(), parent

    def gdn(idx: list[int], parent: Tensor | None) -> tuple[Tensor, Tensor]:
        n = len(idx)
        states = torch.zeros(1, n, heads, vdim, kdim, device=device)  # per-step recurrent state
        out = fused_sigmoid_gating_delta_rule_update(
            A_log=a_log,
            a=a[idx].contiguous(),
            dt_bias=dt_bias,
            softplus_beta=1.0,
            softplus_threshold=20.0,
            q=q[:, idx].contiguous(),
            k=k[:, idx].contiguous(),
            v=v[:, idx].contiguous(),
            b=b[idx].contiguous(),
            initial_state_source=h0.clone(),
            initial_state_indices=zero,
            cu_seqlens=torch.tensor([0, n], dtype=torch.int32, device=device),
            use_qk_l2norm_in_kernel=True,
            disable_state_update=True,
            intermediate_states_buffer=states,
            intermediate_state_indices=zero,
            cache_steps=n,
            retrieve_parent_token=parent,
        )
        return out.reshape(n, heads, vdim), states[0]

    tree_out, tree_win, parent = conv(x, tree=True)
    _, shared_win, _ = conv(x, tree=True, chain_layout=True)  # the layout the worker replaces
    tree_o, tree_state = gdn(list(range(t)), parent)
    flat_out, _, _ = conv(x, tree=False)
    flat_o, _ = gdn(list(range(t)), None)
    err = dict.fromkeys(("conv", "window", "gdn", "state", "flat_conv", "flat_gdn", "chain_layout_window"), 0.0)

    def bump(key: str, diff: Tensor) -> None:
        err[key] = max(err[key], float(diff.float().abs().max()))

    for slot, path in enumerate(paths):
        chain_out, chain_win, _ = conv(x[:, :, path], tree=False)
        chain_o, chain_state = gdn(path, None)
        bump("conv", chain_out[:, -1] - tree_out[:, slot])
        bump("window", chain_win[-1] - tree_win[slot])
        bump("chain_layout_window", chain_win[-1] - shared_win[slot])
        bump("gdn", chain_o[-1] - tree_o[slot])
        bump("state", chain_state[-1] - tree_state[slot])
        bump("flat_conv", chain_out[:, -1] - flat_out[:, slot])
        bump("flat_gdn", chain_o[-1] - flat_o[slot])
    assert parent is not None
    return {
        "nodes": t,
        "max_depth": max(len(p) for p in paths) - 1,
        "dtype": str(dtype).removeprefix("torch."),
        "parents": parent[0].cpu().tolist() == [0, *lay.parents.tolist()[1:]],
        "err": err,
    }


def passed(report: dict[str, Any]) -> bool:
    tree_ok = all(all(r[k] for k in ("mask", "positions", "links", "accept", "walk")) for r in report["tree_kernels"])
    gdn_ok = all(
        r["parents"]
        and max(r["err"][k] for k in ("conv", "window", "gdn", "state")) < TOL[r["dtype"]]
        and min(r["err"]["flat_conv"], r["err"]["flat_gdn"], r["err"]["chain_layout_window"]) > 1e-2
        for r in report["gdn"]
    )
    return tree_ok and gdn_ok


def run(device: str, small: bool, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    shapes = [(14, 3, 6), (31, 4, 6)] if small else [(14, 3, 6), (31, 4, 6), (40, 8, 6), (5, 1, 6)]
    report: dict[str, Any] = {
        "tree_kernels": [check_tree_kernels(device, b, k, d, seeds=[0, 1, 2, 5]) for b, k, d in shapes],
        "gdn": [check_gdn_kernels(device, 3, 9, 3, 5, dims=(24, 2, 8, 8), dtype=dtype)],
    }
    if not small:  # realistic GDN head sizes
        report["gdn"].append(check_gdn_kernels(device, 7, 31, 4, 15, dims=(256, 4, 128, 128), dtype=dtype))
    report["passed"] = passed(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddtree.sglang.devcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="fewer, smaller cases (for the CPU interpreter)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    report = run(args.device, args.small, getattr(torch, args.dtype))
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
