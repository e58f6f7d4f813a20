"""Batched, device-resident DDTree build: every request's tree from the drafter's log-probs `[bs, R, V]` with a
fixed number of tensor ops per depth over the whole batch. No Python loop over requests, no host sync, static
shapes for a given (bs, R, V, budget, topk), so the build can be captured in a CUDA graph.

Same trees as `ddtree.tree.build_tree_heap` (and `build_tree_reference`), ids and ties included; the order and
its tie-breaking are the ones ddtree.tree documents:

1. per row, the top-k by (log-prob desc, token id asc): `batch_row_topk`, exact under ties without a host
   round trip (the ids of the tokens tied at the cut come from a scan of that row, not from `topk`, whose choice
   among equal values is unspecified);
2. nodes ranked by (score desc, depth asc, parent id asc, rank asc), float32 scores `parent + log-prob`.

Depth by depth (as `build_tree`), the best `budget` candidates of each depth are kept, ordered by (score desc,
parent position, rank) with one stable sort; a global stable sort over all kept nodes gives the heap's pop order.
Every candidate is a real node (a -inf score included), so the number kept per depth, M_d = min(budget,
M_{d-1} * k), is known on the host: no padding, every shape a Python int.

Inputs are trusted log-probs (<= 0, no NaN): checking would need a host sync, so the batched build does not
raise on bad values (`build_tree_heap` does).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.tree import DraftTree

TIE_CHUNK = 256  # vocabulary chunk of the tie scan in `first_true`


@dataclass(frozen=True)
class BatchTrees:
    """bs trees of the same static size N (root included), node ids in pop order (= build_tree_heap's ids)."""

    tokens: Tensor  # [bs, N] int64; node 0 = the root (the last committed token)
    parents: Tensor  # [bs, N] int64; -1 for the root; parents[:, i] < i
    depths: Tensor  # [bs, N] int64
    scores: Tensor  # [bs, N] float32; root 0.0
    slot_keys: Tensor  # [bs, N] int64, unique per request: ascending = SGLang's BFS slot order (depth, parent
    #                    slot, id); root 0

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[1])

    def tree(self, b: int) -> DraftTree:
        """Request b's tree as a `DraftTree` (for tests and references; a view, no sync)."""
        return DraftTree(tokens=self.tokens[b], parents=self.parents[b], depths=self.depths[b], scores=self.scores[b])


def level_sizes(rows: int, budget: int, topk: int, vocab: int) -> list[int]:
    """Nodes kept per depth 1..min(rows, budget): M_d = min(budget, M_{d-1} * k), M_0 = 1 (the root)."""
    k = min(topk, vocab)
    sizes, prev = [], 1
    for _ in range(min(rows, budget)):
        prev = min(budget, prev * k)
        sizes.append(prev)
    return sizes


def tree_nodes(rows: int, budget: int, topk: int, vocab: int) -> int:
    """N, the nodes of every built tree, root included (data-independent: all candidates are real nodes)."""
    return 1 + min(budget, sum(level_sizes(rows, budget, topk, vocab)))


def first_true(mask: Tensor, count: int, chunk: int = TIE_CHUNK) -> Tensor:
    """Column ids of the first `count` True entries of every row, ascending; `V` where a row has fewer.

    mask: [n, V] bool -> [n, count] int64. Two passes instead of a full [n, V] cumsum: True counts per chunk of
    `chunk` columns (one reduction over the mask), then a scan of only the `count` chunks that hold the wanted
    entries. Static shapes, no host sync.
    """
    n, vocab = mask.shape
    device = mask.device
    full = vocab // chunk * chunk
    parts = []
    if full:
        parts.append(mask[:, :full].view(n, full // chunk, chunk).sum(-1, dtype=torch.int32))
    if full < vocab:
        parts.append(mask[:, full:].sum(-1, keepdim=True, dtype=torch.int32))
    counts = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]  # [n, G]
    groups = counts.shape[1]
    upto = counts.cumsum(-1, dtype=torch.int32)  # [n, G] Trues up to and including each chunk
    want = torch.arange(1, count + 1, dtype=torch.int32, device=device).expand(n, count).contiguous()  # [n, c]
    where = torch.searchsorted(upto, want)  # [n, c] the chunk holding the j-th True; G if none
    cidx = where.clamp(max=groups - 1)
    rank = (want - upto.gather(1, cidx) + counts.gather(1, cidx)).unsqueeze(-1).contiguous()  # [n, c, 1] 1-based
    cols = cidx.unsqueeze(-1) * chunk + torch.arange(chunk, device=device)  # [n, c, chunk]
    win = mask.gather(1, cols.clamp(max=vocab - 1).view(n, count * chunk)).view(n, count, chunk) & (cols < vocab)
    inside = torch.searchsorted(win.cumsum(-1, dtype=torch.int32), rank).squeeze(-1)  # [n, c]
    return torch.where(where < groups, cidx * chunk + inside, vocab)


def batch_row_topk(lp: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per-row top-k by (log-prob desc, token id asc), on lp's device, no host sync. Equals `row_topk`.

    lp: [n, V] float32, k <= V -> (values [n, k] float32, token ids [n, k] int64). `topk` gives the right values
    (a multiset) but may pick any of the tokens tied at the cut; those come from `first_true` instead: the cut
    value v = the k-th value, the tokens strictly above v from `topk`, the rest the smallest ids equal to v.
    """
    top_vals, top_ids = lp.topk(k, dim=-1)  # [n, k], values sorted descending
    cut = top_vals[:, k - 1 :]  # [n, 1]
    above = (top_vals > cut).sum(-1, keepdim=True)  # [n, 1] tokens strictly above the cut, a prefix of top_*
    ids, perm = top_ids.sort(dim=-1)  # canonical order: id asc, then a stable sort by value desc
    order = torch.sort(top_vals.gather(1, perm), dim=-1, descending=True, stable=True).indices
    ids = ids.gather(1, order)  # [n, k]: the `above` prefix is final
    ties = first_true(lp == cut, k)  # [n, k] smallest ids equal to the cut value, ascending
    j = torch.arange(k, device=lp.device)
    ids = torch.where(j < above, ids, ties.gather(1, (j - above).clamp(min=0)))
    return lp.gather(1, ids), ids


def build_trees_batched(draft_logprobs: Tensor, root_tokens: Tensor, budget: int, topk: int) -> BatchTrees:
    """Every request's DDTree on the log-probs' device: the tree `build_tree_heap(draft_logprobs[b],
    root_tokens[b], budget, topk)` builds, for all b at once.

    draft_logprobs: [bs, R, V] (row d - 1 = depth d), root_tokens: [bs] int. Ops: one top-k scan over the
    vocabulary, then per depth one stable sort of [bs, M_{d-1} * k] candidate scores and a few gathers, then one
    stable sort of [bs, sum M_d] for the pop order.
    """
    if draft_logprobs.dim() != 3 or draft_logprobs.shape[2] < 1:
        raise ValueError(f"draft_logprobs must be [bs, R, V] with V >= 1, got {tuple(draft_logprobs.shape)}")
    if root_tokens.shape != draft_logprobs.shape[:1]:
        raise ValueError(f"root_tokens must be [bs={draft_logprobs.shape[0]}], got {tuple(root_tokens.shape)}")
    if budget < 0 or topk < 1:
        raise ValueError(f"budget must be >= 0 and topk >= 1, got {budget}, {topk}")
    bs, n_rows, vocab = draft_logprobs.shape
    device = draft_logprobs.device
    sizes = level_sizes(n_rows, budget, topk, vocab)
    roots = root_tokens.to(device=device, dtype=torch.int64).view(bs, 1)
    if not sizes:  # budget 0 or no rows: the root alone
        zeros = torch.zeros((bs, 1), dtype=torch.int64, device=device)
        return BatchTrees(roots, zeros - 1, zeros, torch.zeros((bs, 1), device=device), zeros)
    depth_rows = len(sizes)
    k = min(topk, vocab)
    lp = draft_logprobs.detach()[:, :depth_rows].to(torch.float32)  # lp: [bs, R', V]
    vals, ids = batch_row_topk(lp.reshape(bs * depth_rows, vocab), k)
    vals, ids = vals.view(bs, depth_rows, k), ids.view(bs, depth_rows, k)  # [bs, R', k]

    level_scores, level_parent, level_tokens, level_keys = [], [], [], []
    prev_scores = torch.zeros((bs, 1), device=device)  # the root
    prev_bfs = torch.zeros((bs, 1), dtype=torch.int64, device=device)  # BFS rank inside the level
    for d, m in enumerate(sizes):  # depth d + 1
        cand = (prev_scores[:, :, None] + vals[:, d, None, :]).reshape(bs, -1)  # [bs, P * k] parent-major
        order = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :m]  # (score desc, pos, rank)
        parent, rank = order // k, order % k  # [bs, m]
        # BFS inside the level: by (parent's BFS rank, rank); keys unique, so a node's rank = keys below it
        key = prev_bfs.gather(1, parent) * k + rank  # [bs, m]
        prev_bfs = (key[:, None, :] < key[:, :, None]).sum(-1)  # [bs, m]
        prev_scores = cand.gather(1, order)
        level_scores.append(prev_scores)
        level_parent.append(parent)
        level_tokens.append(ids[:, d].gather(1, rank))
        level_keys.append(prev_bfs + (d + 1) * (budget + 1))  # slot key: (depth, BFS rank in the level)

    offsets = [0]
    for m in sizes[:-1]:
        offsets.append(offsets[-1] + m)
    total = offsets[-1] + sizes[-1]
    scores = torch.cat(level_scores, dim=1)  # [bs, T] flat = (depth asc, position in the level asc)
    parent_flat = torch.cat(  # parent as a flat index, -1 = the root
        [level_parent[0] - 1] + [level_parent[d] + offsets[d - 1] for d in range(1, depth_rows)], dim=1
    )  # [bs, T]
    n = min(budget, total)
    sel = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :n]  # [bs, n] flat ids, pop order
    node_id = torch.zeros((bs, total + 1), dtype=torch.int64, device=device)  # flat + 1 -> node id (root: 0)
    node_id.scatter_(1, sel + 1, torch.arange(1, n + 1, device=device).expand(bs, n))
    parents = node_id.gather(1, parent_flat.gather(1, sel) + 1)
    slot_keys = torch.cat(level_keys, dim=1).gather(1, sel)  # [bs, n]
    depths = torch.div(slot_keys, budget + 1, rounding_mode="floor")
    zero = torch.zeros((bs, 1), dtype=torch.int64, device=device)
    return BatchTrees(
        tokens=torch.cat([roots, torch.cat(level_tokens, dim=1).gather(1, sel)], dim=1),
        parents=torch.cat([zero - 1, parents], dim=1),
        depths=torch.cat([zero, depths], dim=1),
        scores=torch.cat([torch.zeros((bs, 1), device=device), scores.gather(1, sel)], dim=1),
        slot_keys=torch.cat([zero, slot_keys], dim=1),
    )
