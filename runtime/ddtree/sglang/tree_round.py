"""The SGLang tree worker's pure parts, tested without SGLang (`ddtree.sglang.tree_worker` runs them): the
per-request host references of the round's device path (`plan_round`, `commit_round`; for parity
tests and the benchmark), the worker's start-up and self-check helpers, and what each step of a round hands the
next (the step dataclasses: `RoundRunner.draft` -> DraftBlock -> `RoundRunner.plan` -> PlannedRound ->
`TreeVerifier.verify` -> VerifiedRound -> `RoundRunner.commit` -> KeptRound)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ddtree.sglang.batch_round import BatchPlan
from ddtree.sglang.layout import SGLangTreeLayout, full_mask, stack_links, to_sglang_layout
from ddtree.sglang.vocab_parallel import HeadShard
from ddtree.tree import DraftTree, build_tree_heap, is_off_spine

# ---------------------------------------------------------------------------------------------------
# Pure parts (unit-tested without SGLang). plan_round / commit_round are the per-request host
# references of the round's device path (ddtree.sglang.batch_round), kept for parity tests and the benchmark.
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeRound:
    """One decode round's trees in SGLang's verify shapes. bs requests, S = block size slots each."""

    trees: list[DraftTree]
    layouts: list[SGLangTreeLayout]
    tokens: Tensor  # [bs, S] int64: verify input ids, slot order
    positions: Tensor  # [bs * S] int64: prefix_len + depth
    custom_mask: Tensor  # [sum_b S * (prefix_len_b + S)] bool: SGLang's FULL_MASK
    retrieve_index: Tensor  # [bs, S] int64
    retrieve_next_token: Tensor  # [bs, S] int64
    retrieve_next_sibling: Tensor  # [bs, S] int64


def plan_round(
    draft_logprobs: Tensor,
    root_tokens: Sequence[int],
    prefix_lens: Sequence[int],
    num_slots: int,
    budget: int,
    topk: int,
) -> TreeRound:
    """Build every request's tree and its verify inputs (CPU tensors). draft_logprobs: [bs, R, V] (row d - 1 =
    depth d), on any device."""
    if draft_logprobs.dim() != 3 or not draft_logprobs.shape[0] == len(root_tokens) == len(prefix_lens):
        raise ValueError("draft_logprobs must be [bs, R, V] with one root token and prefix length per request")
    if budget + 1 > num_slots:
        raise ValueError(f"budget {budget} does not fit {num_slots} slots (budget + 1 <= slots)")
    host = torch.device("cpu")
    trees = [  # top-k on the log-probs' device; only [B - 1, k + 1] per request reaches the host
        build_tree_heap(lp, root_token=int(root), budget=budget, topk=topk, device=host)
        for lp, root in zip(draft_logprobs, root_tokens, strict=True)
    ]
    layouts = [to_sglang_layout(t, int(p), num_slots) for t, p in zip(trees, prefix_lens, strict=True)]
    index, next_token, next_sibling = stack_links(layouts)
    return TreeRound(
        trees=trees,
        layouts=layouts,
        tokens=torch.stack([lay.draft_tokens for lay in layouts]),
        positions=torch.cat([lay.positions for lay in layouts]),
        custom_mask=full_mask(layouts, [int(p) for p in prefix_lens]),
        retrieve_index=index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
    )


@dataclass(frozen=True)
class TreeCommit:
    """What the round commits, from verify_tree_greedy's outputs. bs requests, S slots each."""

    paths: list[list[int]]  # accepted slots per request, path order, starting with 0 (the root)
    out_tokens: Tensor  # [bs, S] int64: committed tokens (accepted drafts then the bonus), rest 0
    commit_lens: Tensor  # [bs] int32: tau = accepted drafts + 1
    bonus: Tensor  # [bs] int64: the target's token after the last accepted node
    perm: Tensor  # [bs, S] int64: accepted slots first (path order), the others after (ascending)
    off_spine: list[bool]


def commit_round(plan: TreeRound, accept_index: Tensor, accept_num: Tensor, target_predict: Tensor) -> TreeCommit:
    """accept_index: [bs, W] flat rows b * S + slot (-1 padded); accept_num: [bs] accepted drafts;
    target_predict: [bs, S] the target's argmax after each slot."""
    bs, s = plan.tokens.shape
    index, num, predict = accept_index.cpu().tolist(), accept_num.cpu().tolist(), target_predict.cpu()
    out_tokens = torch.zeros((bs, s), dtype=torch.int64)
    perm = torch.empty((bs, s), dtype=torch.int64)
    paths, off_spine = [], []
    for b in range(bs):
        path = [int(row) - b * s for row in index[b][: int(num[b]) + 1]]
        if path[0] != 0 or any(not 0 <= slot < plan.layouts[b].num_nodes for slot in path):
            raise RuntimeError(f"verify_tree_greedy returned a bad path for request {b}: {path}")
        paths.append(path)
        out_tokens[b, : len(path)] = predict[b, path]
        rest = [slot for slot in range(s) if slot not in set(path)]
        perm[b] = torch.tensor(path + rest, dtype=torch.int64)
        nodes = tuple(plan.layouts[b].order[path].tolist())
        off_spine.append(is_off_spine(plan.trees[b], nodes))
    commit_lens = torch.tensor([len(p) for p in paths], dtype=torch.int32)
    bonus = torch.stack([predict[b, paths[b][-1]] for b in range(bs)]).to(torch.int64)
    return TreeCommit(
        paths=paths, out_tokens=out_tokens, commit_lens=commit_lens, bonus=bonus, perm=perm, off_spine=off_spine
    )


def verify_slots(budget: int, block: int) -> int:
    """Verify slots per request: DFLASH's block B when the tree fits it (budget <= B - 1), else 2 * B, the
    window SGLang's DFLASH scheduling already reserves per request (committed + 2 * B KV slots). A tree is
    never deeper than B - 1 (the drafter's rows), so what a round commits always fits B."""
    if budget + 1 <= block:
        return block
    if budget + 1 <= 2 * block:
        return 2 * block
    raise ValueError(
        f"DDTREE: DDTREE_BUDGET={budget} is too large for tree verify on SGLang: the tree must fit the verify "
        f"window DFLASH reserves, 2 * block_size={2 * block} slots (DDTREE_BUDGET <= {2 * block - 1})"
    )


def cost_max(head: HeadShard) -> Callable[[Tensor], Tensor] | None:
    """At TP > 1, the policy ledger's reduction of round costs: their MAX over the TP group, on its gloo (CPU)
    group, so every rank feeds its policy the same numbers (the slowest rank's) and decides the same shapes."""
    if head.tp_size == 1 or head.group is None:
        return None
    group = head.group.cpu_group

    def reduce(costs: Tensor) -> Tensor:  # [n] float64 on the host
        torch.distributed.all_reduce(costs, op=torch.distributed.ReduceOp.MAX, group=group)
        return costs

    return reduce


def folded_draft_head_warning(draft_sampler: Any, runs_chain_rounds: bool = False) -> str:
    """A warning when DFLASH's greedy draft head is folded into the drafter's CUDA graph ("" otherwise). A tree
    round builds its trees from the drafter's hidden states and never reads that head's tokens, so every replay
    computes it for nothing: 0.6-0.8 ms of a round at Qwen3-8B's shapes on an H200 (docs/sglang.md, "Cost at
    real shapes"). SGLang folds it in unless SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1 (opsctl renders it, except for a
    shape policy that runs DFLASH's chain rounds: those read the head, so no warning then)."""
    if draft_sampler is None or runs_chain_rounds:
        return ""
    return (
        "DDTREE tree: DFLASH's greedy draft head is folded into the drafter's CUDA graph and runs every round "
        "unused; set SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1 to leave it out"
    )


def reproducible(batch: Any) -> list[bool] | None:
    """Which rows draw the same choices in a second verify of the same path (None: all): greedy rows, and
    every row when SGLang samples with seeds (--enable-deterministic-inference); unseeded sampled rows draw anew."""
    info = batch.sampling_info
    if info is None or info.is_all_greedy or info.sampling_seed is not None:
        return None
    return [int(k) == 1 for k in info.top_ks.view(-1).tolist()]


def dense_conv_windows(state: Any) -> Any | None:
    """`state` (SGLang's MambaPool.SpeculativeState) with a dense per-step conv-window buffer, or None when its
    buffers are dense already.

    On CUDA, with DFLASH's top-k of 1, SGLang stores the verify's per-step conv windows deduplicated: one
    [dim, steps + K - 2] buffer per (layer, slot), step t's window an overlapping `as_strided` view of columns
    t .. t + K - 2 (`mem_cache/memory_pool.py:598`, gated by `conv_window_dedup_enabled`). That is exact for a
    chain, whose consecutive windows do overlap; a tree node's window holds its own ancestors, so writing it
    overwrites its neighbours' (siblings got wrong conv windows, then wrong states). A CPU always
    gets the dense layout, which is why only the GPU decoded wrong tokens. Every reader takes the buffers from
    the pool's state at each call, so replacing them once at start-up is enough."""
    windows = state.intermediate_conv_window
    if all(window.is_contiguous() for window in windows):
        return None
    dense = [torch.zeros(window.shape, dtype=window.dtype, device=window.device) for window in windows]
    return dataclasses.replace(state, intermediate_conv_window=dense)


def hybrid_tree_refusal(linear_backend: Any, mamba_pool: Any) -> str:
    """Why SGLang's linear-attention backend cannot run the exact tree verify; "" when it can.

    The exact path is the GDN backend's recurrent target-verify branch fed the tree's links: it needs the
    per-step snapshots (`intermediate_ssm`, which --enable-linear-replayssm-spec does not allocate). Under CUDA
    graphs the links are the backend's static buffers, filled before each replay (`ddtree.sglang.hybrid_graphs`)."""
    if type(linear_backend).__name__ != "GDNAttnBackend" or not hasattr(linear_backend, "topk"):
        return f"its linear-attention backend is {type(linear_backend).__name__}, not SGLang's GDN backend"
    for flag in ("replayssm_spec_fold", "replayssm_cache_base", "replayssm_is_kda"):
        if getattr(mamba_pool, flag, None) not in (None, False):
            return "ReplaySSM speculative verify (--enable-linear-replayssm-spec) keeps no per-node states"
    return ""


# ---------------------------------------------------------------------------------------------------
# The round's steps, and what each hands the next. `RoundRunner.run` (round_runner.py) runs them in order:
#   draft (DraftBlock) -> plan (PlannedRound) -> TreeVerifier.verify (VerifiedRound, round_verify.py) ->
#   commit (KeptRound).
# bs requests, B = DFLASH's block size, S = verify slots per request (B, or 2B for a wide tree).
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVWindow:
    """The first W KV slots SGLang reserved after each request's prefix (spec-v2 reserves 2B)."""

    positions: Tensor  # [bs, W] int64: prefix_len + 0 .. W - 1
    locs: Tensor  # [bs, W] int64: req_to_token there, the KV locations the forward writes
    plan: Any  # SGLang's KVLocPlan for that window


@dataclass(frozen=True)
class DraftBlock:
    """draft -> plan, commit: DFLASH's draft block went through the drafter in the first B reserved slots."""

    prefix_lens: Tensor  # [bs]: committed lengths before the round (batch.seq_lens)
    window: KVWindow  # W = B
    hidden: Tensor  # [bs, B - 1, H]: the drafter's hidden states at depths 1 .. B - 1


@dataclass(frozen=True)
class PlannedRound:
    """plan -> verify, commit: every request's tree in SGLang's verify layout, on the device."""

    plan: BatchPlan  # tokens, positions, tree masks, retrieve_* links, [bs, S]
    custom_mask: Tensor  # SGLang's FULL_MASK, [sum_b S * (prefix_b + S)] bool
    window: KVWindow  # W = S: the draft's window, or twice as wide
    graphed: bool  # plan (hence commit) replayed from the worker's RoundGraphs
    budget: int  # the trees' nodes (the configured budget, or the policy's smaller one)


@dataclass(frozen=True)
class VerifiedRound:
    """verify -> commit: the target's verdict on every tree; nothing committed yet."""

    output: Any  # SGLang's forward result: logits_output (hidden states [bs * S, H]), can_run_cuda_graph, ...
    target_predict: Tensor  # [bs, S]: the target's token after each slot
    accept_index: Tensor  # [bs, S] int32: accepted flat rows b * S + slot in path order, -1 padded
    accept_num: Tensor  # [bs] int32: accepted drafts
    check: bool  # a self-check round: the commit re-verifies the paths as chains
    conv_snapshot: list[tuple[Tensor, Tensor, Tensor]] | None  # hybrid check round: conv states before verify


@dataclass(frozen=True)
class KeptRound:
    """What a round commits: the tree's accepted path, or on a self-check round the chain re-verify's."""

    commit_lens: Tensor  # [bs] int32: tau, committed tokens incl. the bonus
    out_tokens: Tensor  # [bs, >= B] int64: committed tokens, rest 0
    bonus: Tensor  # [bs] int64: the first token of the next round
    state_index: Tensor  # the accept index commit_mamba_states_after_verify reads (hybrid targets)
    state_width: int  # its verify width (S, or B for the chain)
    predict: Tensor  # [bs * width]: the choice after each verify row (what a row's log-prob is taken of)
    hidden_rows: Tensor | None  # [bs, S]: verify rows in path order; None: already in path order
    hidden_loc: Tensor  # [bs, >= B] int64: the drafter's KV locations, path order
    logits_output: Any  # the forward whose hidden states go to the drafter (and to SGLang's result)
