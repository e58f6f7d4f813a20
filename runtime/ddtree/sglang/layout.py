"""A DDTree draft tree in the layout SGLang's EAGLE tree verify consumes. Pure torch; never imports sglang.

SGLang 0.5.23 (`sglang/srt/speculative/eagle_utils.py: build_tree_kernel_efficient`, its kernels in
`sglang/kernels/ops/speculative/spec_tree.py`) describes one request's verify tree of N draft tokens by:

- slot order: slot 0 is the root (the bonus token), every parent before its children, siblings contiguous
  (EAGLE's sorted top-score indices are grouped by parent; we use BFS: depth, then parent slot, then the
  DDTree id, which keeps a parent's children in the drafter's rank order);
- positions: seq_len + depth;
- the tree mask: row i attends to the whole committed prefix plus slot j iff j is i or an ancestor of i.
  FULL_MASK flattens, per request, an [N, seq_len + N] row-major block, blocks concatenated in batch order
  (what the triton and flashinfer backends read through mask_indptr = cumsum(N * (seq_len + N)));
  QLEN_ONLY keeps only the [N, N] tree part per request;
- retrive_index[b, i] = b * N + i (a flat row index into the verify forward's outputs);
- retrive_next_token[i] = i's first child (smallest slot) or -1; retrive_next_sibling[i] = the next larger
  sibling slot or -1. The GDN tree kernels rebuild each node's parent from these two links while scanning
  slots in order, which is only right when parents precede children and sibling chains ascend.

`verify_tree_greedy` walks those links: at the current node it takes the target's token and looks for a
child with that token (following next_sibling); a match is accepted, a miss ends the walk, and the target's
token at the last accepted node is the bonus. `greedy_accept` is that walk in plain Python, and `kv_commit`
says which of the verify's KV slots the accepted path keeps (page_size 1) and which step's recurrent state
SGLang's `commit_mamba_states_after_verify` must keep (the slot of the last accepted node).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ddtree.tree import DraftTree


@dataclass(frozen=True)
class SGLangTreeLayout:
    """One request's tree in SGLang slot order. S = number of slots (real nodes + padding)."""

    order: Tensor  # [N] int64: order[k] = DDTree node id at slot k (real nodes only)
    draft_tokens: Tensor  # [S] int64: token per slot; slot 0 = the root (bonus) token
    parents: Tensor  # [S] int64: parent slot (-1 for the root); padding slots hang off the root
    depths: Tensor  # [S] int64: 0 for the root; padding slots have depth 1
    positions: Tensor  # [S] int64: prefix_len + depth
    tree_mask: Tensor  # [S, S] bool: mask[i, j] = j is i or an ancestor of i
    retrieve_next_token: Tensor  # [S] int64: first child slot, -1 if none
    retrieve_next_sibling: Tensor  # [S] int64: next sibling slot, -1 if none
    num_nodes: int  # N, the real nodes (root included); slots N..S-1 are padding, reachable by no link

    @property
    def num_slots(self) -> int:
        return int(self.draft_tokens.shape[0])

    @property
    def slot_of(self) -> Tensor:
        """[N] inverse of `order`: slot_of[node id] = slot."""
        inv = torch.empty_like(self.order)
        inv[self.order] = torch.arange(self.order.shape[0], dtype=self.order.dtype)
        return inv


@dataclass(frozen=True)
class TreeAccept:
    """The greedy walk over one request's layout, in slots."""

    accept_slots: tuple[int, ...]  # slots on the accepted path, starting with 0 (the root), path order
    bonus_token: int  # the target's token at the last accepted slot

    @property
    def tau(self) -> int:
        """Committed tokens this round (accepted drafted nodes + the bonus) = KV entries kept."""
        return len(self.accept_slots)


@dataclass(frozen=True)
class KVCommit:
    """What one request keeps from its verify forward (page_size 1: one KV slot per token)."""

    kept_cache_loc: Tensor  # [tau] the accepted slots' KV cache locations, path order; they become
    #                         req_to_token[prefix_len : prefix_len + tau]
    freed_cache_loc: Tensor  # [S - tau] every other slot's cache location, ascending slot order
    hidden_rows: Tensor  # [tau] rows of the verify's per-slot outputs (hidden states fed back to the
    #                      drafter, at positions prefix_len .. prefix_len + tau - 1), path order
    last_step: int  # slot of the last accepted node: SGLang's last_correct_step_indices for this request


def bfs_order(parents: Tensor, depths: Tensor) -> Tensor:
    """DDTree node ids in BFS slot order: by depth, then parent slot, then id. parents, depths: [N] -> [N]."""
    par, dep = parents.tolist(), depths.tolist()
    n = len(par)
    children: list[list[int]] = [[] for _ in range(n)]
    for node in range(1, n):
        if not 0 <= par[node] < node or dep[node] != dep[par[node]] + 1:
            raise ValueError(f"node {node}: parent {par[node]} must come first and sit one level up")
        children[par[node]].append(node)  # ascending ids = the drafter's rank order in a built tree
    order = [0]
    for slot in range(n):  # a FIFO over `order` itself: each slot's children appended contiguously
        order.extend(children[order[slot]])
    return torch.tensor(order, dtype=torch.int64)


def to_sglang_layout(tree: DraftTree, prefix_len: int, num_slots: int | None = None) -> SGLangTreeLayout:
    """The tree in SGLang's slot order, optionally padded to `num_slots` (a fixed draft_token_num, as the
    verify's static shapes and CUDA graphs need). Padding slots carry the root token, hang off the root in
    the mask (so attention stays well defined) and are linked from nowhere, so no walk can accept them.
    Host-side index math; the tensors come back on the CPU."""
    parents = tree.parents.cpu()
    depths = tree.depths.cpu()
    tokens = tree.tokens.cpu()
    n = tree.num_nodes
    s = n if num_slots is None else num_slots
    if s < n:
        raise ValueError(f"num_slots={s} is smaller than the tree ({n} nodes, root included)")
    order = bfs_order(parents, depths)  # [N]
    slot_of = torch.empty_like(order)
    slot_of[order] = torch.arange(n)

    slot_parents = torch.zeros(s, dtype=torch.int64)  # padding: parent = root
    slot_parents[:n] = torch.where(parents[order] < 0, -1, slot_of[parents[order].clamp(min=0)])
    slot_depths = torch.ones(s, dtype=torch.int64)
    slot_depths[:n] = depths[order]
    slot_tokens = torch.full((s,), int(tokens[0]), dtype=torch.int64)
    slot_tokens[:n] = tokens[order]

    mask = torch.eye(s, dtype=torch.bool)  # row-inheriting ancestor mask: parents' rows are final first
    plist = slot_parents.tolist()
    for i in range(1, s):
        mask[i] |= mask[plist[i]]

    next_token = torch.full((s,), -1, dtype=torch.int64)
    next_sibling = torch.full((s,), -1, dtype=torch.int64)
    last_child: dict[int, int] = {}
    for i in range(1, n):  # real slots only: padding is reachable by no link
        p = plist[i]
        if p in last_child:
            next_sibling[last_child[p]] = i
        else:
            next_token[p] = i
        last_child[p] = i

    return SGLangTreeLayout(
        order=order,
        draft_tokens=slot_tokens,
        parents=slot_parents,
        depths=slot_depths,
        positions=slot_depths + prefix_len,
        tree_mask=mask,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        num_nodes=n,
    )


# ---------------------------------------------------------------------------------------------------
# Batch tensors in SGLang's shapes
# ---------------------------------------------------------------------------------------------------


def _check_batch(layouts: Sequence[SGLangTreeLayout]) -> int:
    if not layouts:
        raise ValueError("need at least one layout")
    sizes = {lay.num_slots for lay in layouts}
    if len(sizes) != 1:
        raise ValueError(f"every request must have the same number of slots (pad them), got {sorted(sizes)}")
    return sizes.pop()


def retrieve_index(batch_size: int, num_slots: int) -> Tensor:
    """[bs, S] int64: retrive_index[b, i] = b * S + i."""
    return torch.arange(batch_size * num_slots, dtype=torch.int64).view(batch_size, num_slots)


def stack_links(layouts: Sequence[SGLangTreeLayout]) -> tuple[Tensor, Tensor, Tensor]:
    """(retrive_index, retrive_next_token, retrive_next_sibling), each [bs, S] int64."""
    s = _check_batch(layouts)
    nt = torch.stack([lay.retrieve_next_token for lay in layouts])
    ns = torch.stack([lay.retrieve_next_sibling for lay in layouts])
    return retrieve_index(len(layouts), s), nt, ns


def full_mask(layouts: Sequence[SGLangTreeLayout], prefix_lens: Sequence[int]) -> Tensor:
    """SGLang's FULL_MASK custom mask: per request b, [S, prefix_lens[b] + S] row-major (prefix all True,
    then the tree mask), flattened and concatenated -> [sum_b S * (prefix_lens[b] + S)] bool."""
    s = _check_batch(layouts)
    if len(prefix_lens) != len(layouts):
        raise ValueError("one prefix length per layout")
    blocks = []
    for lay, plen in zip(layouts, prefix_lens, strict=True):
        block = torch.ones((s, plen + s), dtype=torch.bool)
        block[:, plen:] = lay.tree_mask
        blocks.append(block.reshape(-1))
    return torch.cat(blocks)


def qlen_mask(layouts: Sequence[SGLangTreeLayout]) -> Tensor:
    """SGLang's QLEN_ONLY custom mask: the [S, S] tree masks flattened and concatenated -> [bs * S * S]."""
    _check_batch(layouts)
    return torch.cat([lay.tree_mask.reshape(-1) for lay in layouts])


# ---------------------------------------------------------------------------------------------------
# Acceptance and commit
# ---------------------------------------------------------------------------------------------------


def greedy_accept(layout: SGLangTreeLayout, target_predict: Tensor) -> TreeAccept:
    """SGLang's greedy tree walk for one request. target_predict: [S], the target's token after each slot
    (argmax of its verify logits). Children are tried in next_sibling order; the first match wins."""
    if target_predict.shape != (layout.num_slots,):
        raise ValueError(f"target_predict must be [{layout.num_slots}], got {tuple(target_predict.shape)}")
    predict = target_predict.tolist()
    tokens = layout.draft_tokens.tolist()
    first_child = layout.retrieve_next_token.tolist()
    next_sibling = layout.retrieve_next_sibling.tolist()
    path = [0]
    while True:
        want = predict[path[-1]]
        child = first_child[path[-1]]
        while child != -1 and tokens[child] != want:
            child = next_sibling[child]
        if child == -1:
            return TreeAccept(accept_slots=tuple(path), bonus_token=want)
        path.append(child)


def accept_tensors(
    accepts: Sequence[TreeAccept], target_predicts: Sequence[Tensor], num_slots: int, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The batch in verify_tree_greedy's output form: accept_index [bs, width] (flat slot rows b * S + slot
    on the path, padded with -1), accept_token_num [bs] (accepted drafted nodes, the root excluded) and
    predicts [bs * S] (the target's token at every accepted row, -1 elsewhere: the committed tokens, read
    in path order through accept_index). width = the deepest possible path + 1."""
    bs = len(accepts)
    index = torch.full((bs, width), -1, dtype=torch.int64)
    num = torch.zeros(bs, dtype=torch.int64)
    predicts = torch.full((bs * num_slots,), -1, dtype=torch.int64)
    for b, (acc, target) in enumerate(zip(accepts, target_predicts, strict=True)):
        if acc.tau > width:
            raise ValueError(f"request {b}: path of {acc.tau} slots does not fit width {width}")
        rows = torch.tensor(acc.accept_slots, dtype=torch.int64) + b * num_slots  # [tau]
        index[b, : acc.tau] = rows
        num[b] = acc.tau - 1
        predicts[rows] = target[list(acc.accept_slots)]
    return index, num, predicts


def kv_commit(layout: SGLangTreeLayout, accept: TreeAccept, out_cache_loc: Tensor) -> KVCommit:
    """Which verify KV slots one request keeps. out_cache_loc: [S] the cache location written per slot.
    The root's slot is always kept (the previous bonus token now has its KV at prefix_len)."""
    if out_cache_loc.shape != (layout.num_slots,):
        raise ValueError(f"out_cache_loc must be [{layout.num_slots}], got {tuple(out_cache_loc.shape)}")
    path = torch.tensor(accept.accept_slots, dtype=torch.int64)  # [tau]
    keep = torch.zeros(layout.num_slots, dtype=torch.bool)
    keep[path] = True
    return KVCommit(
        kept_cache_loc=out_cache_loc[path],
        freed_cache_loc=out_cache_loc[~keep],
        hidden_rows=path,
        last_step=accept.accept_slots[-1],
    )


def eagle_selection(layout: SGLangTreeLayout, topk: int) -> tuple[Tensor, Tensor]:
    """The (parent_list, top_scores_index) pair from which SGLang's build_tree_kernel_efficient rebuilds
    exactly this layout: every node with children gets a group g >= 1 (in slot order; the root's group is
    0) and its k-th child the candidate index g * topk + k; parent_list[g] is the parent's own candidate
    index. Sorted candidate indices then enumerate the slots 1..N-1 in order. Only real nodes (no padding).
    Returns parent_list [G] and top_scores_index [N - 1], int64."""
    n = layout.num_nodes
    if layout.num_slots != n:
        raise ValueError("eagle_selection takes an unpadded layout")
    plist = layout.parents.tolist()
    group: dict[int, int] = {0: 0}
    cand = [0] * n  # candidate index per slot (root: unused)
    parent_list = [0]  # group 0 = the root's children; its entry is never read
    rank: dict[int, int] = {}
    for i in range(1, n):
        p = plist[i]
        if p not in group:
            group[p] = len(parent_list)
            parent_list.append(cand[p])
        k = rank.get(p, 0)
        if k >= topk:
            raise ValueError(f"slot {p} has more than topk={topk} children")
        rank[p] = k + 1
        cand[i] = group[p] * topk + k
    return torch.tensor(parent_list, dtype=torch.int64), torch.tensor(cand[1:], dtype=torch.int64)
