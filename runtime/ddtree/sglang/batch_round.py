"""DDTREE's SGLang round on the device: batched tree planning, commit and statistics. Pure torch, no sglang.

`plan_batch` turns the drafter's log-probs `[bs, R, V]` into every request's tree in SGLang's EAGLE verify layout
(the layout `ddtree.sglang.layout.to_sglang_layout` documents, padded to S slots), and `commit_batch` turns
`verify_tree_greedy`'s outputs into what the round commits. Both run where their inputs are, with a fixed number
of tensor ops for the whole batch, no host sync and static shapes for a given (bs, R, V, S, budget, topk), so each
can be captured in a CUDA graph. They equal the per-request references `tree_worker.plan_round` /
`commit_round` (which build with `build_tree_heap` and lay out on the host); tests/runtime/test_sglang_batch_round.py
checks it, ties, off-spine acceptance and padding requests included.

FULL_MASK's size depends on the prefix lengths, so `full_mask_batched` is a separate step (one scatter of the
`[bs, S, S]` tree masks into a block of ones) taking its size from the host. `StatsQueue` keeps the per-request
statistics on the device and reads them once per DDTREE metrics line, so the log lines stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.batch_tree import BatchTrees, ancestor_masks, bfs_slot_order, build_trees_batched, build_trees_from_topk
from ddtree.config import FusedBuild
from ddtree.fused_tree import build_trees_fused, fused_available, kernels
from ddtree.metrics import MetricsLog
from ddtree.stats import round_stats
from ddtree.tree import TreeShape

STAT_FIELDS = ("accepted_len", "nodes", "depth", "off_spine", "width", "bad_path")


@dataclass(frozen=True)
class BatchPlan:
    """One round's trees in SGLang's verify shapes, on the device. bs requests, S slots each, N real nodes each."""

    trees: BatchTrees  # node ids in pop order (= build_tree_heap's)
    order: Tensor  # [bs, N] int64: DDTree node id at slot (real slots)
    tokens: Tensor  # [bs, S] int64: verify input ids, slot order; padding slots carry the root token
    parents: Tensor  # [bs, S] int64: parent slot, -1 for the root; padding slots hang off the root
    depths: Tensor  # [bs, S] int64: padding slots have depth 1
    positions: Tensor  # [bs * S] int64: prefix_len + depth
    tree_mask: Tensor  # [bs, S, S] bool: mask[b, i, j] = j is i or an ancestor of i
    retrieve_index: Tensor  # [bs, S] int64: b * S + i
    retrieve_next_token: Tensor  # [bs, S] int64: first child slot, -1 if none
    retrieve_next_sibling: Tensor  # [bs, S] int64: next sibling slot, -1 if none
    depth: Tensor  # [bs] int64: the tree's deepest node
    width: Tensor  # [bs] int64: most nodes at one depth >= 1

    @property
    def num_nodes(self) -> int:
        """N, the real slots per request (root included): static, the same for every request."""
        return int(self.order.shape[1])


def plan_batch(
    draft_logprobs: Tensor,
    root_tokens: Tensor,
    prefix_lens: Tensor,
    num_slots: int,
    budget: int,
    topk: int,
    fused: FusedBuild | None = None,
) -> BatchPlan:
    """Every request's tree and its verify inputs, on the log-probs' device (FULL_MASK: `full_mask_batched`).

    draft_logprobs: [bs, R, V] (row d - 1 = depth d); root_tokens, prefix_lens: [bs] int tensors. `fused`: the
    planner setting (`DDTreeConfig.fused_build`; None: this process's, `ddtree.config.process_config`).
    """
    _check_budget_fits(budget, num_slots)
    prefix_lens = prefix_lens.to(draft_logprobs.device)
    if fused_available(draft_logprobs.device, topk, fused):  # 5 Triton launches (ddtree.fused_tree)
        trees = build_trees_fused(draft_logprobs, root_tokens, budget, topk)
        return layout_batch_fused(trees, prefix_lens, num_slots)
    trees = build_trees_batched(draft_logprobs, root_tokens, budget, topk)
    return layout_batch(trees, prefix_lens, num_slots)


def layout_batch_fused(trees: BatchTrees, prefix_lens: Tensor, num_slots: int) -> BatchPlan:
    """`layout_batch` in one Triton launch (one program per request; `ddtree._triton_tree.layout_kernel`)."""
    bs, n = trees.tokens.shape
    s = num_slots
    _check_slots(n, s)
    device = trees.tokens.device

    def ints(*shape: int) -> Tensor:
        return torch.empty(shape, dtype=torch.int64, device=device)

    order, tokens, parents, depths, positions = ints(bs, n), ints(bs, s), ints(bs, s), ints(bs, s), ints(bs, s)
    index, next_token, next_sibling, depth, width = ints(bs, s), ints(bs, s), ints(bs, s), ints(bs), ints(bs)
    mask = torch.empty((bs, s, s), dtype=torch.int8, device=device)
    kernels().layout_kernel[(bs,)](  # type: ignore[union-attr]
        trees.tokens, trees.parents, trees.depths, prefix_lens.to(torch.int64).contiguous(), order, tokens,
        parents, depths, positions, mask, index, next_token, next_sibling, depth, width,
        N=n, S=s, NP=1 << max(s - 1, 0).bit_length(), MAXD=max(n - 1, 1), num_warps=4,
    )  # fmt: skip
    return BatchPlan(
        trees=trees,
        order=order,
        tokens=tokens,
        parents=parents,
        depths=depths,
        positions=positions.view(-1),
        tree_mask=mask.view(torch.bool),
        retrieve_index=index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        depth=depth,
        width=width,
    )


def plan_batch_topk(
    top_vals: Tensor, top_ids: Tensor, root_tokens: Tensor, prefix_lens: Tensor, num_slots: int, budget: int
) -> BatchPlan:
    """`plan_batch` from each drafter row's top-k already taken, top_vals / top_ids [bs, R, k] (a vocab-parallel
    head at TP > 1: `ddtree.sglang.vocab_parallel.head_topk`)."""
    _check_budget_fits(budget, num_slots)
    trees = build_trees_from_topk(top_vals, top_ids, root_tokens, budget)
    return layout_batch(trees, prefix_lens.to(top_vals.device), num_slots)


def _check_budget_fits(budget: int, num_slots: int) -> None:
    if budget + 1 > num_slots:
        raise ValueError(f"budget {budget} does not fit {num_slots} slots (budget + 1 <= slots)")


def _check_slots(nodes: int, num_slots: int) -> None:
    if num_slots < nodes:
        raise ValueError(f"num_slots={num_slots} is smaller than the trees ({nodes} nodes, root included)")


def layout_batch(trees: BatchTrees, prefix_lens: Tensor, num_slots: int) -> BatchPlan:
    """`to_sglang_layout` for a whole batch: slots in BFS order (depth, parent slot, id), padded to S slots."""
    bs, n = trees.tokens.shape
    s = num_slots
    _check_slots(n, s)
    device = trees.tokens.device
    ancestors = ancestor_masks(trees.parents)  # [bs, N, N] in node ids
    order = bfs_slot_order(trees.parents, trees.depths, ancestors)  # [bs, N] node id per slot
    ar_n = torch.arange(n, device=device).expand(bs, n)
    slot_of = torch.empty_like(order).scatter_(1, order, ar_n)  # [bs, N] slot per node id
    node_parent = trees.parents.gather(1, order)  # [bs, N] parent node id per slot
    real_parents = torch.where(node_parent < 0, -1, slot_of.gather(1, node_parent.clamp(min=0)))
    pad = s - n
    parents = torch.cat([real_parents, real_parents.new_zeros((bs, pad))], dim=1)  # [bs, S] padding: the root
    depths = torch.cat([trees.depths.gather(1, order), trees.depths.new_ones((bs, pad))], dim=1)
    roots = trees.tokens[:, :1]
    tokens = torch.cat([trees.tokens.gather(1, order), roots.expand(bs, pad)], dim=1)

    # The ancestor mask in slots: real slots permuted, a padding slot sees itself and the root.
    slots = torch.arange(s, device=device)
    rows = ancestors.gather(1, order[:, :, None].expand(bs, n, n)).gather(2, order[:, None, :].expand(bs, n, n))
    pad_pattern = (slots[:, None] >= n) & ((slots[None, :] == 0) | (slots[:, None] == slots[None, :]))  # [S, S]
    reach = torch.nn.functional.pad(rows, (0, pad, 0, pad)) | pad_pattern

    # Links over real slots: siblings are contiguous in BFS order.
    same_as_next = parents[:, 1:n] == torch.cat([parents[:, 2:n], parents.new_full((bs, 1), -2)], dim=1)
    next_sibling = torch.full((bs, s), -1, dtype=torch.int64, device=device)
    next_sibling[:, 1:n] = torch.where(same_as_next, torch.arange(2, n + 1, device=device), -1)
    first = torch.ones((bs, n - 1), dtype=torch.bool, device=device)  # slot i >= 1 is its parent's first child
    first[:, 1:] = parents[:, 2:n] != parents[:, 1 : n - 1]
    target = torch.where(first, parents[:, 1:n], s)  # [bs, N - 1]; s = a discarded column
    next_token = torch.full((bs, s + 1), -1, dtype=torch.int64, device=device)
    next_token.scatter_(1, target, slots[1:n].expand(bs, n - 1))

    counts = (trees.depths[:, :, None] == torch.arange(1, n, device=device)).sum(1)  # [bs, N - 1] nodes per depth
    return BatchPlan(
        trees=trees,
        order=order,
        tokens=tokens,
        parents=parents,
        depths=depths,
        positions=(prefix_lens.to(torch.int64)[:, None] + depths).reshape(-1),
        tree_mask=reach,
        retrieve_index=torch.arange(bs * s, device=device).view(bs, s),
        retrieve_next_token=next_token[:, :s].contiguous(),  # SGLang's kernels index [bs, S] rows by b * S
        retrieve_next_sibling=next_sibling,
        depth=trees.depths.max(dim=1).values,
        width=counts.max(dim=1).values if n > 1 else torch.zeros(bs, dtype=torch.int64, device=device),
    )


def full_mask_numel(prefix_sum: int, batch_size: int, num_slots: int) -> int:
    """FULL_MASK's length, sum_b S * (prefix_b + S), from the host's sum of prefix lengths."""
    return num_slots * prefix_sum + batch_size * num_slots * num_slots


def full_mask_batched(tree_mask: Tensor, prefix_lens: Tensor, numel: int, fused: FusedBuild | None = None) -> Tensor:
    """SGLang's FULL_MASK (= `layout.full_mask`): per request b an [S, prefix_b + S] row-major block, prefix all
    True, then the tree mask; blocks concatenated. tree_mask: [bs, S, S] bool, prefix_lens: [bs] on its device,
    numel: `full_mask_numel(sum(prefix_lens))`, known on the host (it sizes the output)."""
    s = tree_mask.shape[1]
    device = tree_mask.device
    plen = prefix_lens.to(device=device, dtype=torch.int64)
    mod = kernels() if fused_available(device, 1, fused) else None
    if mod is not None:  # one Triton launch, one program per (request, row)
        bs = tree_mask.shape[0]
        out8 = torch.empty(numel, dtype=torch.int8, device=device)
        mod.full_mask_kernel[(bs, s)](
            tree_mask.contiguous().view(torch.int8), plen.contiguous(), out8, bs, S=s,
            BS_P=1 << max(bs - 1, 0).bit_length(), BLOCK=1024, num_warps=4,
        )  # fmt: skip
        return out8.view(torch.bool)
    row = plen + s  # [bs] row length
    start = torch.cumsum(s * row, dim=0) - s * row  # [bs] block offsets
    ar = torch.arange(s, device=device)
    at = start[:, None, None] + ar[None, :, None] * row[:, None, None] + plen[:, None, None] + ar[None, None, :]
    out = torch.ones(numel, dtype=torch.bool, device=device)
    return out.scatter_(0, at.reshape(-1), tree_mask.reshape(-1))


@dataclass(frozen=True)
class BatchCommit:
    """What the round commits, from verify_tree_greedy's outputs, on the device. bs requests, S slots each."""

    path: Tensor  # [bs, W] int64: accepted slots in path order from the root (slot 0), -1 after tau
    out_tokens: Tensor  # [bs, S] int64: committed tokens (accepted drafts then the bonus), rest 0
    commit_lens: Tensor  # [bs] int32: tau = accepted drafts + 1
    bonus: Tensor  # [bs] int64: the target's token after the last accepted node
    perm: Tensor  # [bs, S] int64: accepted slots first (path order), the others after (ascending)
    off_spine: Tensor  # [bs] bool: some accepted node is not its parent's first child
    bad_path: Tensor  # [bs] bool: the path does not start at the root, leaves the real slots or skips a level


def commit_batch(plan: BatchPlan, accept_index: Tensor, accept_num: Tensor, target_predict: Tensor) -> BatchCommit:
    """accept_index: [bs, W] flat rows b * S + slot (-1 padded), W <= S; accept_num: [bs] accepted drafts;
    target_predict: [bs, S] the target's token after each slot. A bad path cannot raise here (that would need a
    sync): it is flagged in `bad_path`, which `StatsQueue` turns into an error when it reads the statistics."""
    bs, s = plan.tokens.shape
    w = accept_index.shape[1]
    device = plan.tokens.device
    num = accept_num.to(torch.int64).clamp(0, w - 1)  # [bs]
    j = torch.arange(w, device=device)
    on = j <= num[:, None]  # [bs, W]
    rows = accept_index.to(torch.int64) - torch.arange(bs, device=device)[:, None] * s
    path = torch.where(on, rows, -1)
    safe = torch.where(on, rows, 0).clamp(0, s - 1)  # [bs, W]
    predict = target_predict.to(torch.int64).view(bs, s)
    picked = torch.where(on, predict.gather(1, safe), 0)  # [bs, W]
    out_tokens = torch.cat([picked, picked.new_zeros((bs, s - w))], dim=1) if w < s else picked[:, :s]
    bonus = picked.gather(1, num[:, None]).squeeze(1)

    # perm: the path's slots at their path index, the other slots after, ascending
    at = torch.full((bs, s + 1), -1, dtype=torch.int64, device=device)
    at.scatter_(1, torch.where(on, safe, s), j.expand(bs, w))  # column s: discarded
    at = at[:, :s]
    off = at < 0
    pos = torch.where(off, torch.cumsum(off, dim=1) - 1 + (num + 1)[:, None], at)
    perm = torch.empty((bs, s), dtype=torch.int64, device=device)
    perm.scatter_(1, pos.clamp(0, s - 1), torch.arange(s, device=device).expand(bs, s))

    step = on[:, 1:]  # [bs, W - 1] the path's edges
    first_child = plan.retrieve_next_token.gather(1, safe[:, :-1])
    off_spine = (step & (safe[:, 1:] != first_child)).any(dim=1)
    wrong_parent = step & (plan.parents.gather(1, safe[:, 1:]) != safe[:, :-1])
    outside = on & ((rows < 0) | (rows >= plan.num_nodes))
    bad_path = (rows[:, 0] != 0) | outside.any(dim=1) | wrong_parent.any(dim=1) | (accept_num.to(torch.int64) >= w)
    return BatchCommit(
        path=path,
        out_tokens=out_tokens,
        commit_lens=(num + 1).to(torch.int32),
        bonus=bonus,
        perm=perm,
        off_spine=off_spine,
        bad_path=bad_path,
    )


def stats_tensor(plan: BatchPlan, commit: BatchCommit) -> Tensor:
    """[bs, len(STAT_FIELDS)] int64 per-request statistics, on the device."""
    nodes = torch.full_like(plan.depth, plan.num_nodes - 1)
    cols = [commit.commit_lens.to(torch.int64), nodes, plan.depth, commit.off_spine.to(torch.int64), plan.width]
    return torch.stack([*cols, commit.bad_path.to(torch.int64)], dim=1)


class StatsQueue:
    """Per-request statistics kept on the device until a DDTREE line needs them, then read in one copy.

    `MetricsLog` emits after the first record and every `log_interval` records; `push` reads the queued rounds
    only when the records it adds reach such a line, and feeds them to the log in order, so the lines are the
    ones a per-request `record` would give. Times are host-side per round (split evenly over its requests).
    """

    def __init__(self, log: MetricsLog) -> None:
        self.log = log
        self._stats: list[Tensor] = []  # [bs_i, F] per queued round
        self._times: list[tuple[int, dict[str, float]]] = []  # (bs_i, ms) per queued round
        self._queued = 0
        self.reads = 0  # device-to-host reads so far

    def push(self, stats: Tensor, times_ms: dict[str, float]) -> list[str]:
        """Queue one round's [bs, F] statistics; returns the lines emitted (reading the queue if any)."""
        bs = int(stats.shape[0])
        self._stats.append(stats)
        self._times.append((bs, times_ms))
        self._queued += bs
        if self._queued < self.log.records_until_line():
            return []
        return self.drain()

    def drain(self) -> list[str]:
        """Read every queued round (one device-to-host copy) and record it; raises on a bad accepted path."""
        if not self._stats:
            return []
        rows = torch.cat(self._stats).tolist()  # the one sync
        self.reads += 1
        times = self._times
        self._stats, self._times, self._queued = [], [], 0
        if any(row[5] for row in rows):
            raise RuntimeError(
                "verify_tree_greedy returned a bad path (not from the root, through padding or off a link)"
            )
        lines: list[str] = []
        it = iter(rows)
        for bs, ms in times:
            batch = [next(it) for _ in range(bs)]  # tau, nodes, depth, off_spine, width, bad_path
            shapes = [TreeShape(nodes=row[1], depth=row[2], width=row[4]) for row in batch]
            for stats in round_stats([row[0] for row in batch], shapes, [bool(row[3]) for row in batch], ms):
                lines.extend(self.log.record(stats))
        return lines
