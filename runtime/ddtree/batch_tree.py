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


def check_tree_inputs(draft_logprobs: Tensor, root_tokens: Tensor, budget: int, topk: int) -> None:
    """The shapes and knobs every batched tree builder (torch or fused) accepts; ValueError otherwise."""
    if draft_logprobs.dim() != 3 or draft_logprobs.shape[2] < 1:
        raise ValueError(f"draft_logprobs must be [bs, R, V] with V >= 1, got {tuple(draft_logprobs.shape)}")
    if root_tokens.shape != draft_logprobs.shape[:1]:
        raise ValueError(f"root_tokens must be [bs={draft_logprobs.shape[0]}], got {tuple(root_tokens.shape)}")
    if budget < 0 or topk < 1:
        raise ValueError(f"budget must be >= 0 and topk >= 1, got {budget}, {topk}")


def build_trees_batched(draft_logprobs: Tensor, root_tokens: Tensor, budget: int, topk: int) -> BatchTrees:
    """Every request's DDTree on the log-probs' device: the tree `build_tree_heap(draft_logprobs[b],
    root_tokens[b], budget, topk)` builds, for all b at once.

    draft_logprobs: [bs, R, V] (row d - 1 = depth d), root_tokens: [bs] int. Ops: one top-k scan over the
    vocabulary; per depth one add, one stable sort of [bs, M_{d-1} * k] candidate scores and one add; then one
    stable sort of [bs, sum M_d] for the pop order and a fixed number of gathers.
    """
    check_tree_inputs(draft_logprobs, root_tokens, budget, topk)
    bs, n_rows, vocab = draft_logprobs.shape
    depth_rows, k = len(level_sizes(n_rows, budget, topk, vocab)), min(topk, vocab)
    lp = draft_logprobs.detach()[:, :depth_rows].to(torch.float32)  # lp: [bs, R', V]
    if depth_rows:
        vals, ids = batch_row_topk(lp.reshape(bs * depth_rows, vocab), k)
    else:  # budget 0 or no rows: the root alone
        vals, ids = lp.new_zeros((0, k)), lp.new_zeros((0, k), dtype=torch.int64)
    return build_trees_from_topk(vals.view(bs, depth_rows, k), ids.view(bs, depth_rows, k), root_tokens, budget)


def build_trees_from_topk(top_vals: Tensor, top_ids: Tensor, root_tokens: Tensor, budget: int) -> BatchTrees:
    """`build_trees_batched` from each row's top-k already taken: top_vals, top_ids [bs, R, k] in the order
    `batch_row_topk` gives (log-prob desc, token id asc), e.g. merged from a vocab-parallel head's shards
    (`ddtree.sglang.vocab_parallel`); k = min(topk, V). Rows beyond the first min(R, budget) are not read."""
    if top_vals.dim() != 3 or top_vals.shape != top_ids.shape or top_vals.shape[2] < 1:
        raise ValueError(f"top_vals/top_ids must be equal [bs, R, k >= 1], got {tuple(top_vals.shape)}")
    if root_tokens.shape != top_vals.shape[:1]:
        raise ValueError(f"root_tokens must be [bs={top_vals.shape[0]}], got {tuple(root_tokens.shape)}")
    bs, n_rows, k = top_vals.shape
    device = top_vals.device
    sizes = level_sizes(n_rows, budget, k, k)
    roots = root_tokens.to(device=device, dtype=torch.int64).view(bs, 1)
    zero = torch.zeros((bs, 1), dtype=torch.int64, device=device)
    if not sizes:  # budget 0 or no rows: the root alone
        return BatchTrees(roots, zero - 1, zero, torch.zeros((bs, 1), device=device))
    depth_rows = len(sizes)
    vals = top_vals[:, :depth_rows].to(torch.float32)  # [bs, R', k]
    ids = top_ids[:, :depth_rows].to(torch.int64)

    # A kept node's code packs (depth - 1, parent's flat index + 1, rank): flat = (depth asc, level position).
    total = sum(sizes)
    span = (total + 1) * k
    level_scores, level_codes = [], []
    prev_scores = torch.zeros((bs, 1), device=device)  # the root
    parent_base, start = 0, 0  # flat index + 1 of the parents' level's first node (the root: 0); level start
    for d, m in enumerate(sizes):  # depth d + 1
        cand = (prev_scores[:, :, None] + vals[:, d, None, :]).reshape(bs, -1)  # [bs, P * k] parent-major
        srt = torch.sort(cand, dim=1, descending=True, stable=True)  # (score desc, parent position, rank)
        prev_scores = srt.values[:, :m]
        level_scores.append(prev_scores)
        level_codes.append(srt.indices[:, :m] + (d * span + parent_base * k))
        parent_base, start = start + 1, start + m
    scores = torch.cat(level_scores, dim=1)  # [bs, T]
    n = min(budget, total)
    sel = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :n]  # [bs, n] pop order
    code = torch.cat(level_codes, dim=1).gather(1, sel)  # [bs, n]
    depth0, rest = code // span, code % span  # depth - 1; (parent flat + 1) * k + rank
    parent_flat, rank = rest // k, rest % k  # parent_flat: flat index + 1 (0 = the root)
    node_id = torch.zeros((bs, total + 1), dtype=torch.int64, device=device)  # flat + 1 -> node id (root: 0)
    node_id.scatter_(1, sel + 1, torch.arange(1, n + 1, device=device).expand(bs, n))
    tokens = ids.view(bs, depth_rows * k).gather(1, depth0 * k + rank)
    return BatchTrees(
        tokens=torch.cat([roots, tokens], dim=1),
        parents=torch.cat([zero - 1, node_id.gather(1, parent_flat)], dim=1),
        depths=torch.cat([zero, depth0 + 1], dim=1),
        scores=torch.cat([torch.zeros((bs, 1), device=device), scores.gather(1, sel)], dim=1),
    )


def ancestor_masks(parents: Tensor) -> Tensor:
    """mask[b, i, j] = j is i or an ancestor of i. parents: [bs, N] (-1 for the root) -> [bs, N, N] bool.
    Pointer doubling: ceil(log2(N - 1)) boolean matrix products (float bmm, exact for N <= 2048)."""
    n = parents.shape[1]
    ids = torch.arange(n, device=parents.device)
    reach = (ids[:, None] == ids) | (parents[:, :, None] == ids)  # [bs, N, N] itself or its parent
    for _ in range(max(n - 2, 0).bit_length()):  # 2^t >= N - 1 >= the deepest node
        step = reach.float()
        reach = torch.bmm(step, step) > 0
    return reach


def bfs_slot_order(parents: Tensor, depths: Tensor, ancestors: Tensor) -> Tensor:
    """SGLang's slot order (`layout.bfs_order`: depth, then parent slot, then id) for every tree at once.

    Inside one depth that order is the trees' pre-order (children by id), and a node's pre-order index is its
    depth plus the sizes of the subtrees of every elder sibling of it or of one of its ancestors: a few [bs, N, N]
    products, no loop over depths. parents, depths: [bs, N]; ancestors: `ancestor_masks(parents)`. -> [bs, N]
    node id per slot."""
    n = parents.shape[1]
    ids = torch.arange(n, device=parents.device)
    elder = (parents[:, :, None] == parents[:, None, :]) & (ids[None, :] < ids[:, None])  # [bs, N, N] y elder of x
    anc = ancestors.to(torch.int64)
    size = anc.sum(dim=1)  # [bs, N] subtree sizes (column sums)
    before = (elder * size[:, None, :]).sum(-1)  # [bs, N] nodes in the elder siblings' subtrees
    preorder = depths + (anc * before[:, None, :]).sum(-1)  # [bs, N] < N
    return (depths * n + preorder).argsort(dim=1)
